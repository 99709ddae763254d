"""The autograd Function of the fused policy loss: tensors plus one frozen `PolicyLossParams`."""

import torch

from ..autograd import differentiable_once
from .bwd import policy_bwd
from .fwd import policy_fwd
from .params import PolicyLossParams

__all__ = ["PolicyRowsFunction", "policy_rows_triton"]


class PolicyRowsFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, entropy, advantages, mask, old, ref, weight, params: PolicyLossParams):
        old, ref, weight, advantages = (None if t is None else t.detach() for t in (old, ref, weight, advantages))
        row_loss, stats, seq_log_ratio = policy_fwd(logp, advantages, mask, old, ref, weight, entropy, params)
        ctx.params = params
        ctx.save_for_backward(logp, entropy, advantages, mask, old, ref, weight, seq_log_ratio)
        ctx.mark_non_differentiable(stats)
        return row_loss, stats

    @staticmethod
    @differentiable_once  # the backward is hand-written: a second derivative must raise, not be wrong
    def backward(ctx, grad_row, _grad_stats):
        logp, entropy, advantages, mask, old, ref, weight, seq_log_ratio = ctx.saved_tensors
        inputs = (logp, advantages, mask, old, ref, weight, entropy)
        d_logp, d_entropy = policy_bwd(inputs, seq_log_ratio, grad_row, ctx.params)
        return d_logp, d_entropy, None, None, None, None, None, None


def policy_rows_triton(logp, advantages, mask, old, ref, weight, entropy, params: PolicyLossParams):
    """Triton version of `policy_rows_torch`: same arguments, same (row_loss `[B]`, stats `[B, K]`)."""
    return PolicyRowsFunction.apply(logp, entropy, advantages, mask, old, ref, weight, params)
