"""The LM head of a TRL-patched model, routed through `fastrl.token_logprobs` (docs/math.md §1).

TRL's `GRPOTrainer` scores completions with `model(..., labels=labels, fused_lm_head=True)`, a forward that
`trl.add_fused_lm_head` installs: the backbone, then TRL's chunked log-prob kernel on its last hidden state.
`add_fastrl_lm_head` installs the same call on top of it with fastrl's kernel in place of TRL's, so the policy,
old and reference log-probs all come from fastrl, and every wrapper (DDP, FSDP, PEFT) still sees a forward
of the wrapped model. Calls without `fused_lm_head=True` (generation) go to the previous forward unchanged. A call with
`fastrl_loss=fn` returns `fn(model, last_hidden_state)`: the trainer forms its policy loss (and, on the
gradient-in-forward path, the head's gradients) inside the wrapped model's forward (`head_policy_loss`).

Precision follows TRL's kernel: the head's matmul runs in the autocast dtype when autocast is on (TRL's
default `bf16=True` runs the whole forward under `torch.autocast`, also on CPU) and in the hidden state's
dtype otherwise; `cast_lm_head_to_fp32=True` runs it in float32 outside autocast. fastrl then takes the
log-softmax in float32.
"""

import functools
import types

import torch

from fastrl.hf import lm_body_and_head
from fastrl.kernels import token_logprobs
from fastrl.losses.call import LossCall, PolicyInputs
from fastrl.losses.policy import check_policy_inputs
from fastrl.losses.route import run

from .gather import full_head, gathered, zero3_params, zero3_partitioned, zero3_scored

__all__ = ["add_fastrl_lm_head", "head_policy_loss"]

IGNORE_INDEX = -100


def _compute_dtype(hidden: torch.Tensor, cast_lm_head_to_fp32: bool) -> torch.dtype:
    if cast_lm_head_to_fp32:
        return torch.float32
    if torch.is_autocast_enabled(hidden.device.type):
        return torch.get_autocast_dtype(hidden.device.type)
    return hidden.dtype


def head_logprobs(model, hidden, labels, *, temperature: float, cast_lm_head_to_fp32: bool = False, impl="auto",
                  sampler: dict | None = None):  # fmt: skip
    """(logp, entropy) `[B, T]` float32 of `labels` under `model`'s head on `hidden` `[B, T, D]`; -100 rows give 0.
    `sampler`: top_k / top_p / min_p keywords of `token_logprobs` (the sampler's truncation, docs/math.md §8).

    The head is read in full under FSDP2 and DeepSpeed ZeRO-3 (`gather`: FSDP2's shard once per call; a ZeRO-3
    head DeepSpeed has left partitioned, once per no-grad call)."""
    head = model.get_output_embeddings()
    sharded = zero3_params(head.weight, getattr(head, "bias", None))
    labels = labels.to(head.weight.device)
    dtype = _compute_dtype(hidden, cast_lm_head_to_fp32)

    def score(hidden):
        _, weight, bias = lm_body_and_head(model)
        weight, bias = full_head(weight, bias)
        # The casts are differentiable: the gradient reaches the float32 master weights as through TRL's kernel.
        hidden, weight = hidden.to(weight.device, dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
        return token_logprobs(
            hidden, weight, labels, bias=bias, temperature=temperature, ignore_index=IGNORE_INDEX,
            return_entropy=True, impl=impl, **(sampler or {}),
        )  # fmt: skip

    return zero3_scored(score, hidden, sharded)


def head_policy_loss(model, hidden, targets, policy: PolicyInputs, *, temperature: float, cast_lm_head_to_fp32: bool):
    """(LossOutput, logp, entropy) of the policy loss on `hidden` `[B, T, D]` under `model`'s head, in one call.

    `targets` hold -100 wherever `policy.mask` is 0; `policy` carries the advantages, mask, old / reference / rollout
    log-probs, the `LossConfig`, the normalizer and the kernel choice. The call goes through the loss's one router
    (`fastrl.losses.route`), as `grpo_loss`'s does: with a token-level ratio and a gradient to form the gradients of
    hidden and the head are formed in the vocabulary pass itself (docs/math.md §7): three GEMMs a token instead of
    the forward's one and a recomputing backward's three, and the entropy from the same pass; a config with the
    sampler on (`config.sampler_on`) gets the log-probs of the sampler's distribution. The entropy is always computed
    (TRL logs it). Not for a ZeRO-3 partitioned head (its d_weight would reach a parameter gathered only in the
    forward)."""
    _, weight, bias = lm_body_and_head(model)
    weight, bias = full_head(weight, bias)
    dtype = _compute_dtype(hidden, cast_lm_head_to_fp32)
    hidden, weight = hidden.to(weight.device, dtype), weight.to(dtype)
    bias = None if bias is None else bias.to(dtype)
    targets = targets.to(weight.device)
    call = LossCall(hidden, weight, bias, targets, policy, temperature, policy.config.sampler.truncation(), None,
                    None, True, False, IGNORE_INDEX)  # fmt: skip
    check_policy_inputs(policy, tuple(policy.mask.shape), torch.float32, hidden.device, True)
    return run(call)


def add_fastrl_lm_head(model, temperature: float = 1.0, cast_lm_head_to_fp32: bool = False, impl: str = "auto",
                       sampler: dict | None = None):  # fmt: skip
    """Make `model(..., labels=labels, fused_lm_head=True)` score the labels with fastrl's log-prob kernel.

    Args:
        model: a Hugging Face `*ForCausalLM` (the base model under PEFT), usually already patched by
            `trl.trainer.utils.add_fused_lm_head`.
        temperature: the logits are divided by it (the sampling temperature).
        cast_lm_head_to_fp32: run the head in float32 outside autocast (TRL's option of that name).
        impl: fastrl's kernel choice, "auto", "triton" or "torch".
        sampler: None (the full softmax, TRL's loss) or top_k / top_p / min_p: the log-probs of the sampler's
            truncated distribution (docs/math.md §8).

    Raises:
        ValueError: the model has no separable body and linear head (e.g. a soft-capped head).
    """
    from trl.trainer.utils import FusedCausalLMOutput

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    partitioned = [] if head is None else zero3_partitioned(head.weight, getattr(head, "bias", None))
    with gathered(partitioned):
        lm_body_and_head(model)  # refuse an unsupported head now, not at the first training step
    previous = model.forward

    @functools.wraps(type(model).forward)
    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None,
                fastrl_loss=None, **kwargs):  # fmt: skip
        if not fused_lm_head:
            extra = {"labels": labels, "shift_labels": shift_labels, "num_items_in_batch": num_items_in_batch}
            return previous(*args, **kwargs, **{k: v for k, v in extra.items() if v is not None})
        if kwargs.get("output_router_logits"):
            raise ValueError("fastrl's LM head does not compute the MoE load-balancing loss (output_router_logits)")
        kwargs["use_cache"] = False
        hidden = self.base_model(*args, **kwargs).last_hidden_state
        if fastrl_loss is not None:  # the loss formed inside the wrapped forward: `fastrl_loss(model, hidden)`
            return fastrl_loss(self, hidden)
        if shift_labels is None:
            hidden, labels = hidden[:, :-1], labels[:, 1:]
        else:
            labels = shift_labels
        logp, entropy = head_logprobs(
            self, hidden, labels, temperature=temperature, cast_lm_head_to_fp32=cast_lm_head_to_fp32, impl=impl,
            sampler=sampler,
        )  # fmt: skip
        mask = labels.to(logp.device) != IGNORE_INDEX
        count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        return FusedCausalLMOutput(loss=-logp.sum() / count, log_probs=logp, entropy=entropy, label_mask=mask)

    model.forward = types.MethodType(forward, model)
    model._fastrl_lm_head = True
    return model
