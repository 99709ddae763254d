"""The LM head's full weight under a sharding engine, for the fused head that reads it without calling the module.

- FSDP2: a head that is its own FSDP unit is a sharded `DTensor` when the fused forward reads it (FSDP unshards a
  unit only when one of its modules is called). `full_head` all-gathers it once per forward with `full_tensor()`,
  which is differentiable: its backward reduce-scatters d_weight into the shard's gradient. A head FSDP has
  already unsharded (accelerate's unit of final norm and head, the embedding with it when tied) is a plain tensor.
- DeepSpeed ZeRO-3: outside its module's forward a partitioned parameter holds an empty tensor (numel 0). Inside
  a DeepSpeed engine's forward DeepSpeed usually gathers the head itself: reading `lm_head.weight` there registers
  it as an external parameter of the forward and all-gathers it (DeepSpeed 0.19's discovery of parameters read
  outside their module), and the policy's forwards under TRL read it gathered. TRL's reference model (loaded from
  the policy's path under `deepspeed.zero.Init`, wrapped by its own engine) is read partitioned (numel 0) in its
  no-grad forwards: `zero3_scored` gathers it for the call (TRL's rule: only ZeRO-3 parameters not gathered
  already, tied duplicates once), one gather per forward whatever the rank's token count. A head still
  partitioned at a forward that records gradients is refused: its d_weight would reach a parameter ZeRO-3 has
  partitioned again by the backward (autograd's accumulation fails on the `[0]` shape).
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


def zero3_scored(score, hidden: torch.Tensor, params: list):
    """`score(hidden)` with the ZeRO-3 `params` (the head's weight and bias) gathered for the call where they are
    partitioned; `score` reads them from the model. params = [] (no ZeRO-3) calls `score(hidden)` directly.

    Raises:
        RuntimeError: a partitioned head at a forward that records gradients (DeepSpeed gathers the head it trains
            inside its engine's forward; call the model through the engine, as `GRPOTrainer` does).
    """
    partitioned = zero3_partitioned(*params)
    if partitioned and torch.is_grad_enabled():
        shapes = [tuple(p.ds_shape) for p in partitioned]
        raise RuntimeError(
            f"the LM head's ZeRO-3 parameters {shapes} are partitioned at a forward that records gradients; call "
            "the model through its DeepSpeed engine (which gathers the head it trains) or under torch.no_grad()"
        )
    with gathered(partitioned):
        return score(hidden)
