"""The autograd Function of the gradient-in-forward loss: its backward only scales stored gradients."""

import torch

from ..autograd import differentiable_once

__all__ = ["attach_gradients", "take_weight_gradient"]


class _StoredGradients(torch.autograd.Function):
    @staticmethod
    def forward(ctx, loss, grads, hidden, weight, bias):
        ctx.grads = grads  # (d_hidden, d_weight, d_bias) of the loss, formed in the forward pass
        ctx.save_for_backward(hidden, weight, bias)  # for differentiable_once: the inputs a second derivative reaches
        return loss.clone()

    @staticmethod
    @differentiable_once  # a second derivative must raise, not be silently zero
    def backward(ctx, grad_loss):
        grads = ctx.grads
        if grads is None:
            raise RuntimeError(
                "grpo_loss: a second backward through the same loss; its gradient was formed in the forward "
                "pass and handed out by the first backward (and freed). Call grpo_loss again to get a new loss."
            )
        ctx.grads = None
        if getattr(ctx, "weight_taken", False) and not bool(grad_loss == 1):
            raise RuntimeError(
                f"grpo_loss: backward with grad_output {grad_loss.item()} after the weight's gradient was taken "
                "out of the loss (take_weight_gradient), which assumes 1: call loss.backward() without a scale"
            )
        # In place: the stored buffers become the returned gradients, no second `[V, D]` buffer
        scaled = [None if t is None else t.mul_(grad_loss.to(t.dtype)) for t in grads]
        return None, None, *scaled


def attach_gradients(loss: torch.Tensor, hidden, weight, bias, grads) -> torch.Tensor:
    """`loss` (a detached scalar) connected to hidden / weight / bias with its precomputed gradients.

    Backward returns `grad_output · grads` (the buffers are scaled in place and handed to autograd); a
    second backward raises a RuntimeError.
    """
    return _StoredGradients.apply(loss, tuple(grads), hidden, weight, bias)


def take_weight_gradient(loss: torch.Tensor) -> torch.Tensor | None:
    """Take the weight's gradient out of a gradient-in-forward `loss`; None for any other loss, or when the
    loss holds none (a frozen head) or it was taken already.

    The caller owns the `[V, D]` buffer from then on: the loss's backward hands the weight no gradient, and
    must run with grad_output 1 (`loss.backward()`), else it raises. Sequence parallelism uses it to sum the
    head's gradient over the group in the forward pass and keep only its rows of the sum until the backward
    ends (fastrl/trainer/sequence_parallel.py).
    """
    node = loss.grad_fn
    if not isinstance(node, _StoredGradients._backward_cls) or node.grads is None or node.grads[1] is None:
        return None
    d_hidden, d_weight, d_bias = node.grads
    node.grads, node.weight_taken = (d_hidden, None, d_bias), True
    return d_weight
