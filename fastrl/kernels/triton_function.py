"""Autograd wrapper around the Triton forward and backward; the `impl="triton"` entry point."""

import torch
from torch.autograd.function import once_differentiable

from .chunked import token_logprobs_chunked
from .logprob_bwd import logprob_backward
from .logprob_fwd import logprob_forward
from .params import LogprobParams


class TritonLogprobFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, bias, params: LogprobParams):
        logp, lse, entropy = logprob_forward(hidden, weight, targets, bias, params)
        ctx.params = params
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(hidden, weight, targets, bias, lse, entropy)
        return logp if entropy is None else (logp, entropy)

    @staticmethod
    @once_differentiable  # the backward is hand-written: a second derivative must raise, not be wrong
    def backward(ctx, grad_logp, *grad_rest):
        hidden, weight, targets, bias, lse, entropy = ctx.saved_tensors
        grad_entropy = grad_rest[0] if grad_rest else None
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[3])
        if grad_logp is None and grad_entropy is None or not any(needs):
            return None, None, None, None, None
        d_hidden, d_weight, d_bias = logprob_backward(
            hidden, weight, targets, bias, lse, entropy, grad_logp, grad_entropy, ctx.params, needs
        )
        return d_hidden, d_weight, None, d_bias, None


def token_logprobs_triton(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None,
    params: LogprobParams,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`[N, D]`, `[V, D]`, `[N]` → logp `[N]` (and entropy `[N]`), float32, through the Triton kernels.

    Differentiable w.r.t. hidden, weight and bias; a call under no_grad (or with nothing requiring
    grad) runs the forward kernel alone and keeps nothing for backward.
    """
    if hidden.shape[0] == 0:
        return token_logprobs_chunked(hidden, weight, targets, bias, params)
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in (hidden, weight, bias)):
        logp, _, entropy = logprob_forward(hidden, weight, targets, bias, params)
        return logp, entropy
    out = TritonLogprobFunction.apply(hidden, weight, targets, bias, params)
    return (out, None) if isinstance(out, torch.Tensor) else out
