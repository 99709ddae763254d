"""The autograd Functions of the two log-prob paths, and their `[N, D]` entry points.

Each Function takes the tensors plus one frozen `LogprobParams`. A call under no_grad (or with
nothing requiring grad) runs the forward alone and keeps nothing for backward. The Triton launchers
are imported on the first Triton call: triton is optional, and the chunked path must not need it.
"""

import torch

from ..autograd import differentiable_once
from .chunked import chunked_backward, chunked_forward, no_autocast
from .params import LogprobParams

__all__ = ["ChunkedLogprobFunction", "TritonLogprobFunction", "token_logprobs_chunked", "token_logprobs_triton"]


def _needs_grad(hidden, weight, bias) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))


class ChunkedLogprobFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, bias, params: LogprobParams):
        with no_autocast(hidden):
            logp, entropy, lse = chunked_forward(hidden, weight, targets, bias, params)
        ctx.params = params
        ctx.save_for_backward(hidden, weight, targets, bias, lse, entropy)
        return logp if entropy is None else (logp, entropy)

    @staticmethod
    @differentiable_once  # the backward is hand-written: a second derivative must raise, not be wrong
    def backward(ctx, grad_logp, *grad_rest):
        hidden, weight, targets, bias, lse, entropy = ctx.saved_tensors
        grad_entropy = grad_rest[0] if grad_rest else None
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], False, ctx.needs_input_grad[3])
        with no_autocast(hidden):
            d_hidden, d_weight, d_bias = chunked_backward(
                hidden, weight, targets, bias, lse, entropy, grad_logp, grad_entropy, ctx.params, needs
            )
        return d_hidden, d_weight, None, d_bias, None


def token_logprobs_chunked(hidden, weight, targets, bias, params: LogprobParams):
    """`[N, D]`, `[V, D]`, `[N]` → logp `[N]` (and entropy `[N]`), float32, memory O(N + chunk·V)."""
    if not _needs_grad(hidden, weight, bias):
        with no_autocast(hidden):
            logp, entropy, _ = chunked_forward(hidden, weight, targets, bias, params)
        return logp, entropy
    out = ChunkedLogprobFunction.apply(hidden, weight, targets, bias, params)
    return (out, None) if isinstance(out, torch.Tensor) else out


class TritonLogprobFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, bias, params: LogprobParams):
        from .fwd import logprob_forward

        logp, lse, entropy = logprob_forward(hidden, weight, targets, bias, params)
        ctx.params = params
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(hidden, weight, targets, bias, lse, entropy)
        return logp if entropy is None else (logp, entropy)

    @staticmethod
    @differentiable_once  # the backward is hand-written: a second derivative must raise, not be wrong
    def backward(ctx, grad_logp, *grad_rest):
        from .bwd import logprob_backward

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

    Differentiable w.r.t. hidden, weight and bias.
    """
    if hidden.shape[0] == 0:
        return token_logprobs_chunked(hidden, weight, targets, bias, params)
    if not _needs_grad(hidden, weight, bias):
        from .fwd import logprob_forward

        logp, _, entropy = logprob_forward(hidden, weight, targets, bias, params)
        return logp, entropy
    out = TritonLogprobFunction.apply(hidden, weight, targets, bias, params)
    return (out, None) if isinstance(out, torch.Tensor) else out
