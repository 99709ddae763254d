"""The autograd Function of the Triton log-prob path and its `[N, D]` entry point (the chunked path's live in
chunked.py, next to the walk they run, and are re-exported here).

Each Function takes the tensors plus one frozen `LogprobParams`. A call under no_grad (or with
nothing requiring grad) runs the forward alone and keeps nothing for backward. The Triton launchers
are imported on the first Triton call: triton is optional, and the chunked path must not need it.
"""

import torch

from ..autograd import differentiable_once
from .chunked import ChunkedLogprobFunction, needs_grad, token_logprobs_chunked
from .params import LogprobParams, SampledLogprobs

__all__ = [
    "ChunkedLogprobFunction",
    "TritonLogprobFunction",
    "plain_triton_path",
    "token_logprobs_chunked",
    "token_logprobs_impl",
    "token_logprobs_triton",
]


class TritonLogprobFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, bias, params: LogprobParams, theta=None, row_scale=None):
        from .fwd import logprob_forward

        logp, lse, entropy = logprob_forward(hidden, weight, targets, bias, params, theta=theta, row_scale=row_scale)
        ctx.params = params
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(hidden, weight, targets, bias, lse, entropy, theta, row_scale)
        return logp if entropy is None else (logp, entropy)

    @staticmethod
    @differentiable_once  # the backward is hand-written: a second derivative must raise, not be wrong
    def backward(ctx, grad_logp, *grad_rest):
        from .bwd import logprob_backward

        hidden, weight, targets, bias, lse, entropy, theta, row_scale = ctx.saved_tensors
        grad_entropy = grad_rest[0] if grad_rest else None
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[3])
        if grad_logp is None and grad_entropy is None or not any(needs):
            return None, None, None, None, None, None, None
        saved = (lse, entropy, theta, row_scale)
        grads = (grad_logp, grad_entropy)
        d_hidden, d_weight, d_bias = logprob_backward(hidden, weight, targets, bias, saved, grads, ctx.params, needs)
        return d_hidden, d_weight, None, d_bias, None, None, None


def _row_vector(name: str, t, n: int, device) -> torch.Tensor | None:
    """A per-row `[N]` input as float32 contiguous, or a TypeError / ValueError naming it."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor or None, got {getattr(t, 'dtype', type(t).__name__)}")
    if tuple(t.shape) != (n,):
        raise ValueError(f"{name} must be [N] = [{n}], got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on hidden's device {device}, got {t.device}")
    return t.detach().float().contiguous()


def _check_head(hidden, weight, bias, params: LogprobParams) -> None:
    if weight.dtype != hidden.dtype and not (
        weight.dtype == torch.float32 and hidden.dtype in (torch.bfloat16, torch.float16)
    ):
        raise TypeError(
            f"hidden and weight must share a dtype, or be a bf16/fp16 hidden with a float32 head; got "
            f"{hidden.dtype} and {weight.dtype}"
        )
    if bias is not None and bias.dtype != weight.dtype:
        raise TypeError(f"bias must have the weight's dtype {weight.dtype}, got {bias.dtype}")
    cap = params.softcap
    if cap is not None and not (isinstance(cap, float | int) and 0.0 < cap < float("inf")):
        raise ValueError(f"softcap must be a finite number > 0 or None, got {cap!r}")


def token_logprobs_triton(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None,
    params: LogprobParams,
    theta: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`[N, D]`, `[V, D]`, `[N]` → logp `[N]` (and entropy `[N]`), float32, through the Triton kernels.

    The final logits are z[n] = softcap(h[n]·W + b)·row_scale[n] / τ (docs/math.md §1; softcap = params.softcap,
    `cap·tanh(x / cap)`, off when None; row_scale `[N]`, e.g. 1/τ per token, or None). With `theta` (`[N]`)
    the log-probs and entropy are those of the kept set S = {v : z[n, v] ≥ theta[n]} (−inf keeps every
    token): logp = z_y − log Σ_S exp z, also for a target outside S; the gradient treats S as fixed. A
    bf16/fp16 hidden may come with a float32 weight (and bias): the logits are then an fp32 head's.
    Differentiable w.r.t. hidden, weight and bias.
    """
    _check_head(hidden, weight, bias, params)
    n = hidden.shape[0]
    theta = _row_vector("theta", theta, n, hidden.device)
    row_scale = _row_vector("row_scale", row_scale, n, hidden.device)
    if n == 0:  # nothing to launch: the chunked path returns the empty outputs (and zero gradients)
        return token_logprobs_chunked(hidden.to(weight.dtype), weight, targets, bias, params)
    if not needs_grad(hidden, weight, bias):
        from .fwd import logprob_forward

        logp, _, entropy = logprob_forward(hidden, weight, targets, bias, params, theta=theta, row_scale=row_scale)
        return logp, entropy
    out = TritonLogprobFunction.apply(hidden, weight, targets, bias, params, theta, row_scale)
    return (out, None) if isinstance(out, torch.Tensor) else out


def token_logprobs_impl(impl: str):
    """The `[N, D]`, `[V, D]`, `[N]` log-prob function of a resolved `impl` ("triton" or "torch")."""
    return token_logprobs_triton if impl == "triton" else token_logprobs_chunked


def plain_triton_path(c) -> SampledLogprobs:
    """The plain path of a checked log-prob call (api.py's `_Call`) through the Triton kernels."""
    hidden = c.hidden if c.hidden.dtype == c.weight.dtype else c.hidden.to(c.weight.dtype)  # an fp32 head
    logp, entropy = token_logprobs_triton(hidden, c.weight, c.targets, c.bias, c.params)
    return SampledLogprobs(logp, entropy, None, None, None)
