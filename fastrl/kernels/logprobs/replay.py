"""Log-probs over the sampler's kept sets (docs/math.md §9): the autograd Function and the `[N, D]` entry point.

logp(y) = z_y − log Σ_{v∈S} exp z_v and the entropy of softmax over S, z_v = softcap(h·W_v + b_v)·scale, where
scale is 1/τ (or a per-token 1/τ_t): only the kept pairs' logits are ever formed, so the forward gathers M
rows of W (M = Σ|S|) and the backward touches only those rows. Both implementations (replay_torch.py,
replay_fwd.py / replay_bwd.py) sum in a fixed order per row and per token id: deterministic, and a row's
outputs do not depend on the other rows of the call.
"""

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..autograd import differentiable_once
from .kept_set import KeptSet
from .params import SampledLogprobs
from .replay_torch import (
    cap_slope,
    final_logits,
    missing_target_logits,
    pair_grads,
    replay_backward_torch,
    replay_forward_torch,
)

__all__ = ["ReplayLogprobs", "ReplayParams", "replay_logprobs", "replay_path", "replay_topk"]


@dataclass(frozen=True)
class ReplayParams:
    ignore_index: int = -100  # targets equal to it give logp = H = 0 and no gradient (their sets are empty)
    softcap: float | None = None  # final-logit soft-cap cap·tanh(x / cap), before the scale; None = off
    impl: str = "torch"  # "torch" or "triton" (resolved)


class ReplayLogprobs(NamedTuple):
    logp: torch.Tensor  # [N] float32
    entropy: torch.Tensor  # [N] float32: the entropy of the kept distribution
    missing: torch.Tensor  # [N] bool: the target is not in its row's set (logp finite; leave the row out)
    topk_ids: torch.Tensor | None  # [N, k] int64, −1 past the end of a row's set
    topk_logprobs: torch.Tensor | None  # [N, k] float32, −inf past the end of a row's set


def _forward(hidden, weight, bias, targets, scale, kept: KeptSet, params: ReplayParams):
    """(logp, lse, entropy, x `[M]` raw pair logits, x of the missing targets or None)."""
    x_missing = missing_target_logits(hidden, weight, bias, targets, kept)
    if params.impl == "triton":
        from .replay_fwd import replay_forward_triton

        logp, lse, entropy, x = replay_forward_triton(hidden, weight, bias, targets, scale, kept, params)
        if x_missing is not None:
            rows = torch.nonzero(kept.missing).squeeze(1)
            logp[rows] = final_logits(x_missing, scale[rows], params.softcap) - lse[rows]
    else:
        logp, lse, entropy, x = replay_forward_torch(hidden, weight, bias, targets, scale, kept, params, x_missing)
    return logp, lse, entropy, x, x_missing


class ReplayLogprobFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, scale, kept: KeptSet, params: ReplayParams):
        logp, lse, entropy, x, x_missing = _forward(hidden, weight, bias, targets, scale, kept, params)
        ctx.kept, ctx.params = kept, params
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(hidden, weight, bias, targets, scale, lse, entropy, x, x_missing)
        ctx.mark_non_differentiable(x, lse)
        return logp, entropy, x, lse

    @staticmethod
    @differentiable_once  # the backward is hand-written: a second derivative must raise, not be wrong
    def backward(ctx, grad_logp, grad_entropy, _grad_x, _grad_lse):
        hidden, weight, bias, targets, scale, lse, entropy, x, x_missing = ctx.saved_tensors
        kept, params = ctx.kept, ctx.params
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        if (grad_logp is None and grad_entropy is None) or not any(needs):
            return None, None, None, None, None, None, None
        upstream = (grad_logp, grad_entropy)
        extra = None
        if x_missing is not None and grad_logp is not None:  # the one-hot terms of targets outside their sets
            rows = torch.nonzero(kept.missing).squeeze(1)
            extra = (rows, targets[rows], grad_logp.float()[rows] * scale[rows] * cap_slope(x_missing, params.softcap))
        if params.impl == "triton":
            from .replay_bwd import replay_backward_triton

            saved = (targets, scale, lse, entropy, x)
            grads = replay_backward_triton(hidden, weight, bias, saved, upstream, (kept, extra), params, needs)
        else:
            z = final_logits(x, scale[kept.rows], params.softcap)
            c = pair_grads(x, z, scale[kept.rows], (lse, entropy), upstream, kept, params.softcap)
            grads = replay_backward_torch(hidden, weight, bias, c, kept, extra, needs)
        d_hidden, d_weight, d_bias = grads
        return d_hidden, d_weight, d_bias, None, None, None, None


def replay_topk(x, scale, lse, kept: KeptSet, softcap, k: int):
    """The k most likely tokens of each row's kept distribution: (ids `[N, k]` int64, log-probs `[N, k]`)."""
    n = lse.shape[0]
    z = final_logits(x, scale[kept.rows], softcap)
    by_z = torch.sort(z, descending=True, stable=True).indices
    order = by_z[torch.sort(kept.rows[by_z], stable=True).indices]  # by row, then by z (descending)
    rows = kept.rows[order]
    rank = torch.arange(order.shape[0], device=x.device) - kept.offsets[rows]
    take = rank < k
    ids = torch.full((n, k), -1, dtype=torch.int64, device=x.device)
    logps = torch.full((n, k), float("-inf"), dtype=torch.float32, device=x.device)
    ids[rows[take], rank[take]] = kept.ids[order[take]]
    logps[rows[take], rank[take]] = (z - lse[kept.rows])[order[take]]
    return ids, logps


def replay_logprobs(hidden, weight, bias, targets, scale, kept: KeptSet, params: ReplayParams, return_topk=None):
    """`[N, D]`, `[V, D]`, `[V]`|None, `[N]` int64, `[N]` float32 scales, a checked `KeptSet` → ReplayLogprobs.

    The inputs are checked by the caller (`token_logprobs`); hidden may be bf16/fp16 with a float32 head.
    Differentiable w.r.t. hidden, weight and bias, once.
    """
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    if needs_grad:
        logp, entropy, x, lse = ReplayLogprobFunction.apply(hidden, weight, bias, targets, scale, kept, params)
    else:
        logp, lse, entropy, x, _ = _forward(hidden, weight, bias, targets, scale, kept, params)
    top = replay_topk(x, scale, lse, kept, params.softcap, return_topk) if return_topk else (None, None)
    return ReplayLogprobs(logp, entropy, kept.missing, *top)


def replay_path(c):
    """The replay path of a checked log-prob call (api.py's `_Call`): SampledLogprobs over its `[N]` rows."""
    n, tau = c.targets.shape[0], c.params.temperature
    if isinstance(tau, torch.Tensor):
        scale = 1.0 / tau
    else:
        scale = torch.full((n,), 1.0 / tau, dtype=torch.float32, device=c.hidden.device)
    params = ReplayParams(c.params.ignore_index, c.params.softcap, c.impl)
    out = replay_logprobs(c.hidden, c.weight, c.bias, c.targets.long(), scale, c.kept, params, c.return_topk)
    entropy = out.entropy if c.params.return_entropy else None
    return SampledLogprobs(out.logp, entropy, out.missing, out.topk_ids, out.topk_logprobs)
