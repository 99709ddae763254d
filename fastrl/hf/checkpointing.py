"""Gradient checkpointing of a Hugging Face model with fastrl's selective policy: a checkpointed layer keeps its
fused attention kernel's outputs instead of running the kernel again in the backward.

`enable_checkpointing(model)` turns non-reentrant checkpointing on with that policy (the trainer's builder).
`keep_attention_in_checkpoints(model)` gives it to checkpointing someone else enables: `transformers` hands every
checkpointed layer one `functools.partial(checkpoint, **kwargs)` through the model's `_set_gradient_checkpointing`,
and TRL enables checkpointing again (with `GRPOConfig.gradient_checkpointing_kwargs`) after each generation it runs
on the training model, so the method is wrapped on the model instance and every enable, TRL's included, gets
`context_fn=keep_attention_outputs`. Only non-reentrant checkpointing (`use_reentrant=False`, transformers 5's
default) takes a `context_fn`; a reentrant one, or one with a `context_fn` of the user's, is left as it is.
"""

import functools

import torch

__all__ = ["ATTENTION_OPS", "enable_checkpointing", "keep_attention_in_checkpoints", "keep_attention_outputs"]

ATTENTION_OPS = tuple(
    getattr(torch.ops.aten, name).default
    for name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
    if hasattr(torch.ops.aten, name)
)  # fmt: skip


def keep_attention_outputs():
    """Selective checkpointing: a checkpointed layer keeps its fused attention kernel's outputs (the output and
    its logsumexp, 4·D bytes a token and layer) instead of running the kernel again in the backward. The kernel is
    quadratic in the sequence while the projections around it are linear: at 33k tokens and D = 896 its forward
    is most of a layer's forward time (about 15 s of 20 s on 2 CPU cores), and the recomputed projections still
    rebuild what its backward reads."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(list(ATTENTION_OPS))


def enable_checkpointing(model) -> None:
    """Non-reentrant gradient checkpointing of every layer of `model`, keeping the attention outputs."""
    kwargs = {"use_reentrant": False, "context_fn": keep_attention_outputs}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name; the old one warns
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _with_policy(func):
    if not isinstance(func, functools.partial) or func.keywords.get("use_reentrant") is not False:
        return func
    if "context_fn" in func.keywords:
        return func
    return functools.partial(func.func, *func.args, **func.keywords, context_fn=keep_attention_outputs)


def keep_attention_in_checkpoints(model) -> None:
    """Give `model`'s non-reentrant checkpointing the attention-keeping policy, now and at every later enable."""
    if getattr(model, "_fastrl_keeps_attention", False) or not hasattr(model, "_set_gradient_checkpointing"):
        return
    enable = model._set_gradient_checkpointing

    @functools.wraps(enable)
    def set_gradient_checkpointing(*args, **kwargs):
        if "gradient_checkpointing_func" in kwargs:
            kwargs["gradient_checkpointing_func"] = _with_policy(kwargs["gradient_checkpointing_func"])
        elif len(args) > 1:
            args = (args[0], _with_policy(args[1]), *args[2:])
        return enable(*args, **kwargs)

    model._set_gradient_checkpointing = set_gradient_checkpointing
    for module in model.modules():  # the layers checkpointing is on for already
        if getattr(module, "gradient_checkpointing", False) and hasattr(module, "_gradient_checkpointing_func"):
            module._gradient_checkpointing_func = _with_policy(module._gradient_checkpointing_func)
    model._fastrl_keeps_attention = True
