"""The autograd Function of the gradient-in-forward loss: its backward only scales stored gradients."""

import torch
from torch.autograd.function import once_differentiable

__all__ = ["attach_gradients"]


class _StoredGradients(torch.autograd.Function):
    @staticmethod
    def forward(ctx, loss, grads, hidden, weight, bias):
        ctx.grads = grads  # (d_hidden, d_weight, d_bias) of the loss, formed in the forward pass
        return loss.clone()

    @staticmethod
    @once_differentiable  # a second derivative must raise, not be silently zero
    def backward(ctx, grad_loss):
        grads = ctx.grads
        if grads is None:
            raise RuntimeError(
                "grpo_loss: a second backward through the same loss; its gradient was formed in the forward "
                "pass and handed out by the first backward (and freed). Call grpo_loss again to get a new loss."
            )
        ctx.grads = None
        # In place: the stored buffers become the returned gradients, no second `[V, D]` buffer
        scaled = [None if t is None else t.mul_(grad_loss.to(t.dtype)) for t in grads]
        return None, None, *scaled


def attach_gradients(loss: torch.Tensor, hidden, weight, bias, grads) -> torch.Tensor:
    """`loss` (a detached scalar) connected to hidden / weight / bias with its precomputed gradients.

    Backward returns `grad_output · grads` (the buffers are scaled in place and handed to autograd); a
    second backward raises a RuntimeError.
    """
    return _StoredGradients.apply(loss, tuple(grads), hidden, weight, bias)
