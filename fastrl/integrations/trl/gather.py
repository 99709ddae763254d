"""The LM head's full weight under a sharding engine, for the fused head that reads it without calling the module.

- FSDP2: a head that is its own FSDP unit is a sharded `DTensor` when the fused forward reads it (FSDP unshards a
  unit only when one of its modules is called). `full_head` all-gathers it once per forward with `full_tensor()`,
  which is differentiable: its backward reduce-scatters d_weight into the shard's gradient. A head FSDP has
  already unsharded (accelerate's unit of final norm and head, the embedding with it when tied) is a plain tensor.
- DeepSpeed ZeRO-3: outside its module's forward a partitioned parameter holds an empty tensor (numel 0).
  `zero3_scored` gathers the head (TRL's rule: only ZeRO-3 parameters not gathered already, tied duplicates
  once) for the forward, and again in the backward, which recomputes the head's forward: fastrl's kernels keep
  the weight for their backward, and ZeRO-3 frees it when the gather ends. Each is ONE gather per forward and one
  per backward whatever the rank's token count (zero included), so every rank makes the same collective calls.
  d_weight reaches the parameter through autograd, where ZeRO-3's gradient hooks reduce-scatter it; that needs
  the parameter gathered when autograd accumulates it, which holds inside the engine's forward (DeepSpeed keeps
  it gathered) and not for a head called outside it (autograd then fails on the partitioned `[0]` shape).
"""

import contextlib

import torch

__all__ = ["full_head", "gathered", "zero3_params", "zero3_partitioned", "zero3_scored"]


def full_head(weight: torch.Tensor, bias: torch.Tensor | None):
    """(weight, bias) as plain tensors: a DTensor (FSDP2 shard) all-gathered, differentiably; else unchanged."""
    from torch.distributed.tensor import DTensor

    if isinstance(weight, DTensor):
        weight = weight.full_tensor()
    if isinstance(bias, DTensor):
        bias = bias.full_tensor()
    return weight, bias


def zero3_params(*params) -> list:
    """The distinct ZeRO-3 parameters among `params` (None and plain parameters left out)."""
    return list({id(p): p for p in params if p is not None and hasattr(p, "ds_id")}.values())


def zero3_partitioned(*params) -> list:
    """The distinct ZeRO-3 parameters among `params` that are partitioned now (not gathered)."""
    candidates = zero3_params(*params)
    if not candidates:
        return []
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    return [p for p in candidates if p.ds_status != ZeroParamStatus.AVAILABLE]


def gathered(params: list):
    """A context in which the ZeRO-3 `params` are gathered; a null context for []."""
    if not params:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params)


class _Zero3Scored(torch.autograd.Function):
    """`score(hidden) -> (logp, entropy)` reading the gathered `params`; the backward gathers them again."""

    @staticmethod
    def forward(ctx, score, hidden, *params):
        ctx.score, ctx.params = score, params
        ctx.save_for_backward(hidden)
        with torch.no_grad():
            return score(hidden)

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        (hidden,) = ctx.saved_tensors
        params = ctx.params
        with gathered(zero3_partitioned(*params)), torch.enable_grad():
            h = hidden.detach().requires_grad_(ctx.needs_input_grad[1])
            logp, entropy = ctx.score(h)
            inputs = [t for t, needed in zip((h, *params), ctx.needs_input_grad[1:]) if needed]
            grads = iter(torch.autograd.grad((logp, entropy), inputs, (grad_logp, grad_entropy), allow_unused=True))
        return None, *(next(grads) if needed else None for needed in ctx.needs_input_grad[1:])


def zero3_scored(score, hidden: torch.Tensor, params: list):
    """`score(hidden)` with the ZeRO-3 `params` (the head's weight and bias) gathered where partitioned, in the
    forward and again in the backward; `score` reads them from the model. A head DeepSpeed has gathered already
    (its prefetch) is not gathered again, but still not kept for the backward, where it may be partitioned.
    params = [] (no ZeRO-3) calls `score(hidden)` directly."""
    if not params:
        return score(hidden)
    with gathered(zero3_partitioned(*params)):
        # applied inside the gather: autograd records the full [V, D] shape the returned d_weight has
        return _Zero3Scored.apply(score, hidden, *params)
