"""TRL's gradient checkpointing with fastrl's selective policy: a checkpointed layer keeps its attention outputs.

`transformers` hands every checkpointed layer one `functools.partial(checkpoint, **kwargs)` through the model's
`_set_gradient_checkpointing`, and TRL enables checkpointing again (with `GRPOConfig.gradient_checkpointing_kwargs`)
after each generation it runs on the training model. `keep_attention_in_checkpoints` wraps that method on the
model instance, so every enable, TRL's included, gets `context_fn=keep_attention_outputs` (fastrl.trainer.build):
the backward reuses the fused attention kernel's outputs instead of running the kernel again. Only non-reentrant
checkpointing (`use_reentrant=False`, transformers 5's default) takes a `context_fn`; a reentrant one, or one
with a `context_fn` of the user's, is left as it is.
"""

import functools

__all__ = ["keep_attention_in_checkpoints"]


def _with_policy(func):
    from fastrl.trainer.build import keep_attention_outputs

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
