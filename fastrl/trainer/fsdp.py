"""FSDP2 sharding of the policy (`--fsdp`): parameters, gradients and AdamW state split over the ranks.

`shard_model` calls `fully_shard` on every decoder layer and then on the whole model, whose own group
holds the rest (embeddings, final norm, LM head). Every parameter becomes a DTensor with 1/P of its rows
on each rank; a group's full weights exist only while it runs (all-gathered before its forward and again
before its backward, freed after) and its gradients are reduce-scattered straight into the shards, so
the optimizer steps on shards and AdamW's moments are sharded too.

The update does not call the model's `forward`: it runs the LM body and hands the hidden states with the
head weight to the fused loss, so the root group's hooks would not fire. `run_sharded(model, fn, ...)`
runs `fn(model, ...)` as a registered FSDP forward method instead: the root group (the head weight
among it) is whole during the loss call, and its gradient is reduce-scattered after backward. The
`[N, V]` logits are never built, sharded or not.

Gradients are SUMMED over ranks, not averaged: every rank's loss already divides by the GLOBAL
normalizer of the step (docs/math.md §3), exactly as in the replicated path. Every rank must run the same
number of forward/backward passes (each one all-gathers), so a rank with fewer micro-batches runs
masked filler ones (`filler_sample`).
"""

import types

import torch
from torch import nn

from .batching import Sample


def _fsdp():
    from torch.distributed import fsdp

    if not hasattr(fsdp, "fully_shard"):
        raise RuntimeError(f"--fsdp needs torch.distributed.fsdp.fully_shard (torch >= 2.6), found {torch.__version__}")
    return fsdp


def decoder_layers(model) -> nn.ModuleList:
    """The repeated blocks of a Hugging Face causal LM (`model.model.layers` for Llama, Qwen, Mistral...)."""
    body = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, model.base_model_prefix, None)
    layers = getattr(body, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise ValueError(f"{type(model).__name__} has no decoder `layers` ModuleList to shard one by one")
    return layers


def _run(self, fn, *args, **kwargs):
    return fn(self, *args, **kwargs)


def shard_model(model, *, param_dtype: torch.dtype | None = None):
    """Shard `model` in place over all ranks of the default process group; returns it.

    Args:
        model: a Hugging Face causal LM on this rank's device (every rank builds the same one).
        param_dtype: e.g. torch.bfloat16: the dtype of the gathered weights the forward and backward use
            (the shards, the gradients' reduction and the optimizer stay float32). None: the shards' dtype.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    fsdp = _fsdp()
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("--fsdp needs a process group: launch with torchrun (or init_process_group first)")
    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    layer_mp = fsdp.MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    # The root's call carries the loss inputs (advantages, log-probs): they must keep their float32.
    root_mp = fsdp.MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
    for layer in decoder_layers(model):
        fsdp.fully_shard(layer, mesh=mesh, mp_policy=layer_mp)
    fsdp.fully_shard(model, mesh=mesh, mp_policy=root_mp)
    for module in model.modules():
        if isinstance(module, fsdp.FSDPModule):
            # a plain SUM: no division by the world size (and no PREMUL_SUM, which gloo lacks)
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    model.fastrl_run = types.MethodType(_run, model)
    fsdp.register_fsdp_forward_method(model, "fastrl_run")
    # transformers' marker of an FSDP2 model: `generate` then keeps every rank stepping until all are done
    model._is_fsdp_managed_module = True
    return model


def is_sharded(model) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(model, FSDPModule)


def run_sharded(model, fn, *args, **kwargs):
    """`fn(model, *args, **kwargs)`, with the root group gathered around it when `model` is sharded."""
    if not is_sharded(model):
        return fn(model, *args, **kwargs)
    out = model.fastrl_run(fn, *args, **kwargs)
    if not torch.is_grad_enabled():
        # the root group stays gathered after its forward, for the backward; without one, free it now
        model.reshard()
    return out


def filler_sample(pad_id: int, *, ref: bool, rollout: bool) -> Sample:
    """A one-token sample that carries no loss: keeps a rank's pass count equal to the others'."""
    return Sample(
        [pad_id],
        [pad_id],
        0.0,
        loss_mask=False,
        ref_logprobs=[0.0] if ref else None,
        rollout_logprobs=[0.0] if rollout else None,
    )


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def full_state_items(model):
    """(name, full tensor) pairs of the model's state, gathered ONE tensor at a time (all ranks must iterate).

    For the rollout engine's weight sync: no rank ever holds more than one full tensor beyond its shards.
    """
    if is_sharded(model):
        model.reshard()  # a generate (no backward) may have left the root group gathered
    for name, t in model.state_dict().items():
        yield name, t.full_tensor() if hasattr(t, "full_tensor") else t


def state_bytes(model, optimizer) -> dict:
    """Bytes this rank holds of parameters, gradients and optimizer state (shards only)."""
    params = [p for p in model.parameters()]
    out = {
        "params": sum(_local(p).numel() * _local(p).element_size() for p in params),
        "grads": sum(_local(p.grad).numel() * _local(p.grad).element_size() for p in params if p.grad is not None),
        "optimizer": 0,
    }
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                out["optimizer"] += _local(v).numel() * _local(v).element_size()
    return out
