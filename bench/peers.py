"""The peers a user would pick instead of fastrl, each called through its own installed code.

- TRL: `trl.kernels.ChunkedLogProbFunction` (the log-probs GRPOTrainer computes by default, called as its
  fused LM-head forward calls it), and for the loss op `GRPOTrainer._compute_loss` itself, run on a
  stand-in trainer object that holds the loss's settings and hands it those log-probs.
- Liger-Kernel: `LigerFusedLinearGRPOLoss` (chunked, hidden states in, loss out).
- Cut Cross-Entropy: `linear_cross_entropy` (`impl="cce"` on CUDA, `impl="torch_compile"` elsewhere).
- PyTorch: `torch.nn.functional.linear_cross_entropy` with `options=LinearCrossEntropyOptions()` (its chunked
  path), `reduction="none"`: log-prob = −loss.

Each function has its op's provider signature; a settings combination a peer cannot express raises
ValueError (the bench records it as an error, never as a number).
"""

from collections import defaultdict
from types import SimpleNamespace

import torch

# Liger's and TRL's names of fastrl's aggregation modes (docs/math.md §3)
_LOSS_TYPES = {"seq-mean-token-mean": "grpo", "token-mean": "bnpo", "seq-mean-token-sum-norm": "dr_grpo"}


def _trl_chunk_size() -> int:
    from trl.trainer import utils

    return utils._CHUNKED_LOGPROB_CHUNK_SIZE


def trl_token_logprobs(hidden, weight, targets):
    from trl.kernels import ChunkedLogProbFunction

    # as TRL's fused LM-head forward on a device without Triton: every row scored, ignored ones zeroed
    valid = targets != -100
    out = ChunkedLogProbFunction.apply(
        hidden, weight, None, targets.clamp(min=0), 1.0, _trl_chunk_size(), None, 1.0, ()
    )
    return out[0].masked_fill(~valid, 0)


def _trl_logprobs_and_entropy(hidden, weight, targets, mask, temperature, live_only):
    # As TRL's fused LM-head forward: on Triton devices the live positions only (`hidden[mask]`, scattered
    # back), elsewhere every position scored with its label clamped
    from trl.kernels import ChunkedLogProbFunction

    b, t, d = hidden.shape
    if live_only:
        logp, entropy, *_ = ChunkedLogProbFunction.apply(
            hidden[mask], weight, None, targets[mask], temperature, _trl_chunk_size(), None, 1.0, ("entropy",)
        )
        return (x.new_zeros(mask.shape).masked_scatter(mask, x) for x in (logp, entropy))
    labels = torch.where(mask, targets, -100).clamp(min=0).reshape(-1)
    logp, entropy, *_ = ChunkedLogProbFunction.apply(
        hidden.reshape(-1, d), weight, None, labels, temperature, _trl_chunk_size(), None, 1.0, ("entropy",)
    )
    return logp.view(b, t).masked_fill(~mask, 0), entropy.view(b, t).masked_fill(~mask, 0)


class _Accelerator:
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def trl_grpo_loss(hidden, weight, targets, mask, advantages, old, ref, config, live_only=False):
    """TRL's own GRPO loss code (`GRPOTrainer._compute_loss`) on TRL's chunked log-probs (of the live
    positions only with `live_only`, as on a Triton device; of every position otherwise)."""
    from trl import GRPOTrainer

    if config.loss_agg not in _LOSS_TYPES or config.kl != "k3" or config.entropy_coef != 0:
        raise ValueError(f"TRL's GRPO loss has no equivalent of {config}")
    if config.dual_clip is not None or config.is_cap is not None or config.ratio_level != "token":
        raise ValueError(f"the bench's TRL stand-in covers the token-level clipped loss only, not {config}")
    logp, entropy = _trl_logprobs_and_entropy(hidden, weight, targets, mask, config.temperature, live_only)
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logp, entropy, None),
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=config.beta,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None),
        loss_type=_LOSS_TYPES[config.loss_agg],
        max_completion_length=config.max_completion_length,
        epsilon_low=config.eps_low,
        epsilon_high=config.eps_high,
        use_vllm=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        _entropy_bonus_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        accelerator=_Accelerator(),
    )
    b = mask.shape[0]
    inputs = {
        "prompt_ids": torch.zeros(b, 0, dtype=torch.long, device=mask.device),
        "prompt_mask": torch.zeros(b, 0, dtype=torch.long, device=mask.device),
        "completion_ids": targets,
        "completion_mask": mask.long(),
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
    }
    return GRPOTrainer._compute_loss(trainer, None, inputs)


def liger_grpo_loss(hidden, weight, targets, mask, advantages, old, ref, config):
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    if config.loss_agg not in _LOSS_TYPES or config.kl != "k3" or config.entropy_coef != 0:
        raise ValueError(f"Liger has no equivalent of {config}")
    loss_fn = LigerFusedLinearGRPOLoss(  # its defaults otherwise, compiled=True among them
        beta=config.beta,
        use_ref_model=ref is not None,
        epsilon_low=config.eps_low,
        epsilon_high=config.eps_high,
        loss_type=_LOSS_TYPES[config.loss_agg],
        max_completion_length=config.max_completion_length,
        temperature=config.temperature,
    )
    out = loss_fn(hidden, weight, targets, mask.long(), advantages, ref_per_token_logps=ref, old_per_token_logps=old)
    return out[0] if isinstance(out, tuple) else out


def cce_token_logprobs(hidden, weight, targets):
    from cut_cross_entropy import linear_cross_entropy

    impl = "cce" if hidden.is_cuda else "torch_compile"
    # per-token cross-entropy is −logp; ignored rows give 0 either way
    return -linear_cross_entropy(hidden, weight, targets, reduction="none", impl=impl).float()


def torch_lce_token_logprobs(hidden, weight, targets):
    """PyTorch's own fused LM-head cross-entropy, chunked (`LinearCrossEntropyOptions()`: its CPU / GPU picks)."""
    import torch.nn.functional as F

    options = torch.nn.LinearCrossEntropyOptions()
    return -F.linear_cross_entropy(hidden, weight, targets, reduction="none", options=options)
