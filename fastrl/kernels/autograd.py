"""`differentiable_once`: the decorator of the hand-written backward passes.

torch's `once_differentiable` raises on a second derivative only when a gradient flowing into the
backward itself requires grad. With a constant outer gradient (a linear loss, `logp.sum()`) the first
derivative comes back with no graph, and a double backward that adds any other term then silently drops
this op's second-order part. Here a backward run with `create_graph=True` returns gradients whose own
backward raises, whatever the incoming gradients are.
"""

import functools

import torch

__all__ = ["differentiable_once"]


class _SecondDerivative(torch.autograd.Function):
    @staticmethod
    def forward(ctx, n_grads, *tensors):
        # tensors = the gradients, then the op's inputs that require grad: with those as inputs too, this
        # node lies on the path to them and a double backward runs (and raises) here instead of pruning it
        return tuple(g.clone() for g in tensors[:n_grads])  # clones: a view would hand autograd the base

    @staticmethod
    def backward(ctx, *_):
        raise RuntimeError(
            "fastrl's fused ops are differentiable once: a second derivative (double backward) is not supported"
        )


def differentiable_once(backward):
    @functools.wraps(backward)
    def wrapper(ctx, *args):
        with torch.no_grad():
            grads = backward(ctx, *args)
        if not torch.is_grad_enabled():  # create_graph=False: the common case
            return grads
        is_tensor = [isinstance(g, torch.Tensor) for g in grads]
        live = [g for g, t in zip(grads, is_tensor) if t]
        inputs = [t for t in ctx.saved_tensors if isinstance(t, torch.Tensor) and t.requires_grad]
        if not live or not inputs:
            return grads
        wrapped = iter(_SecondDerivative.apply(len(live), *live, *inputs))
        return tuple(next(wrapped) if t else g for g, t in zip(grads, is_tensor))

    return wrapper
