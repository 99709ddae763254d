"""`grpo_loss` / `GRPOLoss`: hidden states → token log-probs → policy loss, without `[B, T, V]` logits."""

import dataclasses

import torch
from torch import nn

from fastrl.kernels import IMPLS, keep_rows

from .call import LossCall, PolicyInputs
from .config import LossConfig
from .policy import LossOutput, check_policy_inputs
from .route import run

__all__ = ["GRPOLoss", "IGNORE_INDEX", "grpo_loss"]

IGNORE_INDEX = -100


def grpo_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    config: LossConfig | None = None,
    normalizer=None,
    impl: str = "auto",
    process_group=None,
    temperature: torch.Tensor | None = None,
    return_entropy: bool = False,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    min_p: float | torch.Tensor | None = None,
    kept_ids: torch.Tensor | None = None,
    kept_offsets: torch.Tensor | None = None,
    batch_invariant: bool = False,
) -> LossOutput:
    """Fused GRPO/PPO loss straight from the LM body's hidden states (docs/math.md §1–3).

    The logits are divided by config.temperature (match the sampler's), or by a per-token `temperature`.
    The entropy is computed when config.entropy_coef != 0, config.top_entropy_quantile < 1 or
    return_entropy is set; only then is metrics["entropy_mean"] present. Gradients flow into hidden, weight
    and bias in one backward; a weight tied to the input embedding receives the sum of both gradients, as
    autograd does.

    With a token-level ratio and a gradient to form, the gradients are formed in this call's single
    pass over the vocabulary (docs/math.md §7; 6·N·D·V FLOPs, no recompute) and held until backward: a
    `[V, D]` weight gradient lives from this call to `.backward()`, which may run once. Under no_grad,
    for frozen inputs and for GSPO (sequence ratio), the log-probs are computed without any gradient
    work and, when a gradient is wanted, the backward recomputes the logit tiles.

    Args:
        hidden: `[B, T, D]` hidden states after the final norm; position t predicts targets[:, t].
        weight: `[V, D]` LM-head weight (e.g. `model.lm_head.weight`). bias: optional `[V]`.
        targets: `[B, T]` int token ids. At masked positions they may be any id or -100 (ignored);
            a mask-1 position must hold a real id.
        mask, advantages, old_logprobs, ref_logprobs, rollout_logprobs, config, normalizer, impl:
            as in `policy_loss`; `impl` also picks the log-prob implementation.
        process_group: vocab-parallel head, as in `token_logprobs`: weight and bias are this rank's rows,
            every other input is the full one on every rank; the loss equals the unsharded one everywhere.
        temperature: None (use config.temperature) or a `[B, T]` tensor of per-token temperatures (>= 1e-6,
            MIN_TEMPERATURE, everywhere), e.g. a sampler's per-sample temperature broadcast over the completion.
        return_entropy: also compute the entropy (from the same pass) and report metrics["entropy_mean"]
            when config.entropy_coef == 0.
        top_k, top_p, min_p: the sampler's truncation (docs/math.md §8), overriding config's: a number, or a
            per-row `[B]` / per-token `[B, T]` tensor. With any of them (or config.softcap) on, logp, the ratios,
            the KL and the entropy are those of the kept set's distribution, and metrics["outside_kept_frac"] is
            the fraction of masked tokens whose target lies outside it. With process_group a soft-cap works and a
            truncation rule that is on is a ValueError naming it.
        kept_ids, kept_offsets: the sampler's kept sets over the `[B, T]` rows (CSR, as in `token_logprobs`;
            `fastrl.kept_set_from_vllm` makes them): logp, the ratios, the KL and the entropy are those of softmax
            over each set (docs/math.md §9), never the plain fused path. The sets of mask-0 positions are
            ignored; a mask-1 position's target must be in its set (a ValueError naming the position: mask out
            the tokens whose target the sampler did not keep). Not with top_k / top_p / min_p (nor config's).
        batch_invariant: a token's log-prob and entropy, and the d_hidden of its row, are the same bits whichever
            sequences share the call, their number and order (docs/math.md §1.2), on every path (fused, sampler,
            replay, recompute) and in both implementations; it costs speed at small N. The loss and d_weight
            still sum over the batch. Not with process_group (ValueError).

    Returns:
        LossOutput(loss, metrics), as `policy_loss`.
    """
    config = LossConfig() if config is None else config
    if not isinstance(config, LossConfig):
        raise TypeError(f"config must be a LossConfig or None, got {type(config).__name__}")
    _check_head_call(hidden, mask, return_entropy, temperature, batch_invariant)
    targets = _ignore_masked(targets, mask)
    kept = None
    if kept_ids is not None or kept_offsets is not None:
        if kept_ids is None or kept_offsets is None:
            raise ValueError("kept_ids and kept_offsets come together: pass both (the CSR of the kept sets) or neither")
        kept = keep_rows(kept_ids, kept_offsets, (mask != 0).reshape(-1))
    sampler = {
        "top_k": config.top_k if top_k is None else top_k,
        "top_p": config.top_p if top_p is None else top_p,
        "min_p": config.min_p if min_p is None else min_p,
    }
    policy = PolicyInputs(advantages, mask, old_logprobs, ref_logprobs, rollout_logprobs, config, normalizer, impl)
    call = LossCall(
        hidden, weight, bias, targets, policy, config.temperature if temperature is None else temperature, sampler,
        kept, process_group, return_entropy, batch_invariant, IGNORE_INDEX,
    )  # fmt: skip
    check_policy_inputs(policy, tuple(mask.shape), torch.float32, hidden.device, call.entropy_wanted)
    return run(call)[0]


def _check_head_call(hidden, mask, return_entropy, temperature, batch_invariant) -> None:
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3:
        raise ValueError(f"hidden must be a [B, T, D] tensor, got {getattr(hidden, 'shape', type(hidden).__name__)}")
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(hidden.shape[:2]):
        raise ValueError(
            f"mask must be a [B, T] = {tuple(hidden.shape[:2])} tensor, got {getattr(mask, 'shape', mask)}"
        )
    if not isinstance(return_entropy, bool):
        raise TypeError(f"return_entropy must be a bool, got {type(return_entropy).__name__}")
    if temperature is not None and not isinstance(temperature, torch.Tensor):
        raise TypeError(f"temperature must be None (config.temperature) or a [B, T] tensor, got {temperature!r}")
    if not isinstance(batch_invariant, bool):
        raise TypeError(f"batch_invariant must be a bool, got {batch_invariant!r}")


def _ignore_masked(targets, mask: torch.Tensor):
    """targets with IGNORE_INDEX wherever mask is 0 (any id may sit there, and costs no gradient); a mask-1
    position holding IGNORE_INDEX is a ValueError. Targets of the wrong shape or device pass through unchanged,
    for the log-prob op's checks to name."""
    if not (isinstance(targets, torch.Tensor) and targets.shape == mask.shape and mask.device == targets.device):
        return targets
    if targets.dtype in (torch.uint8, torch.int8, torch.int16):
        targets = targets.long()  # -100 wraps in a narrow dtype (uint8: 156 == -100)
    live = mask if mask.dtype == torch.bool else mask != 0
    if targets.numel() and bool((live & (targets == IGNORE_INDEX)).any()):
        raise ValueError(f"targets hold ignore_index={IGNORE_INDEX} at a position where mask is 1")
    return torch.where(live, targets, torch.full_like(targets, IGNORE_INDEX))


class GRPOLoss(nn.Module):
    """`nn.Module` wrapper of `grpo_loss`: `GRPOLoss(loss_agg="grpo", beta=0.04, ...)` takes the
    `LossConfig` fields (or `config=`), plus `impl` and `batch_invariant`; forward takes grpo_loss's tensors."""

    def __init__(self, *, config: LossConfig | None = None, impl: str = "auto", batch_invariant: bool = False,
                 **fields):  # fmt: skip
        super().__init__()
        if config is not None and fields:
            raise ValueError(f"pass either config or LossConfig fields, not both (got fields {sorted(fields)})")
        known = {f.name for f in dataclasses.fields(LossConfig)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise TypeError(f"unknown LossConfig field(s) {unknown}; known: {sorted(known)}")
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        if not isinstance(batch_invariant, bool):
            raise TypeError(f"batch_invariant must be a bool, got {batch_invariant!r}")
        self.config = config if config is not None else LossConfig(**fields)
        self.impl = impl
        self.batch_invariant = batch_invariant

    def forward(self, hidden, weight, targets, mask, advantages, **kwargs) -> LossOutput:
        kwargs.setdefault("batch_invariant", self.batch_invariant)
        return grpo_loss(hidden, weight, targets, mask, advantages, config=self.config, impl=self.impl, **kwargs)

    def extra_repr(self) -> str:
        return f"{self.config}, impl={self.impl!r}, batch_invariant={self.batch_invariant}"
