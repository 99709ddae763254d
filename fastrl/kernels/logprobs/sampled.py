"""Log-probs of the distribution the sampler drew from: truncated, soft-capped, any head dtype (docs/math.md §8).

One forward pass over row chunks builds each `[C, V]` tile of final logits once, finds the row's threshold θ
on it (sampling.py), and keeps only O(N) statistics: the row max, log Σ_S exp(z − max), the entropy, θ. The
backward recomputes each tile from hidden, weight and those statistics (S = {z ≥ θ} again, with no search)
and forms ∂h of the chunk whole, ∂W and ∂b accumulated in float32. With `impl="triton"` the same pass runs
without gradient to find θ (one extra logit GEMM, built by the forward kernel's own tile code: kernel_logits.py),
and the Triton kernels take θ for the log-probs.
"""

import dataclasses

import torch

from ..autograd import differentiable_once
from ..logits import logit_tile, no_autocast
from .chunked import add_target_hits, chunk_bytes, live_index, live_rows_backward, slab_grads
from .function import token_logprobs_triton
from .invariant import invariant_rows, run_blocks
from .params import LogprobParams, SampledLogprobs
from .sampling import Truncation, Workspace, tile_threshold

__all__ = ["SampledLogprobs", "sampled_path", "sampled_forward", "sampled_tile_rows", "token_logprobs_sampled"]


_TILE_BYTES = 24  # the forward holds about 24 bytes per tile element (logits, exp, scratch, int64 bin ids, masks)


def _rows(n_live: int, vocab: int) -> int:
    return max(16, chunk_bytes(n_live, vocab) // (_TILE_BYTES * max(vocab, 1)))


def sampled_tile_rows(vocab: int) -> int:
    """The rows of a batch-invariant block of this path (invariant.py): the chunk budget's tile, whatever N."""
    return invariant_rows(vocab, _TILE_BYTES, 16)


def kernel_temperature(params: LogprobParams):
    """(params, row_scale) as the Triton kernels take the temperature: a float rides in params as is; an `[N]` one
    as the kernels' row scale 1/τ, params then holding 1.0 (the kernels' scalar)."""
    tau = params.temperature
    if isinstance(tau, torch.Tensor):
        return dataclasses.replace(params, temperature=1.0), tau.float().reciprocal()
    return params, None


def _tau_rows(tau, idx):
    return tau[idx] if isinstance(tau, torch.Tensor) else tau


def _torch_tile(hidden, weight, bias, params: LogprobParams):
    # the final logits of rows `idx` into `out`, as the torch walks build them (logits.py)
    tau = params.temperature

    def tile(idx, out):
        return logit_tile(hidden[idx], weight, bias, softcap=params.softcap, tau=_tau_rows(tau, idx), out=out)

    return tile


def _kernel_tile(hidden, weight, bias, params: LogprobParams):
    # the final logits of rows `idx` into `out`, as the Triton forward builds them (kernel_logits.py)
    from .kernel_logits import kernel_logits

    params, row_scale = kernel_temperature(params)

    def tile(idx, out):
        scale = None if row_scale is None else row_scale[idx].contiguous()
        return kernel_logits(hidden[idx].contiguous(), weight, bias, params, scale, out=out)

    return tile


def sampled_forward(hidden, weight, targets, bias, trunc: Truncation | None, params: LogprobParams, topk=None,
                    kernel_logits=False):  # fmt: skip
    """`[N, D]`, `[V, D]`, `[N]` → (SampledLogprobs, stats `[4, N]`: row max, log Σ_S exp(z − max), H, θ), at
    params.temperature (a float or `[N]`).

    kernel_logits: build the tiles as the Triton forward does (its θ search), not as the torch walks do."""
    n, v, dev = hidden.shape[0], weight.shape[0], hidden.device
    zeros = lambda *s, dt=torch.float32: torch.zeros(*s, dtype=dt, device=dev)  # noqa: E731
    logp, stats, outside = zeros(n), zeros(4, n), zeros(n, dt=torch.bool)
    stats[3] = float("-inf")
    entropy = zeros(n) if params.return_entropy else None
    top_ids = zeros(n, topk, dt=torch.int64) if topk else None
    top_lp = zeros(n, topk) if topk else None
    live = live_index(targets, params.ignore_index)
    n_live = n if live is None else live.numel()
    # batch invariance: the caller's block of a fixed row count is one tile (invariant.py)
    rows = max(1, n_live) if params.batch_invariant else _rows(n_live, v)
    ws = Workspace(min(rows, n_live), v, dev)
    build = (_kernel_tile if kernel_logits else _torch_tile)(hidden, weight, bias, params)
    for start in range(0, n_live, rows):
        stop = min(n_live, start + rows)
        idx = slice(start, stop) if live is None else live[start:stop]
        c = stop - start
        z = build(idx, ws.get("z", c))
        zmax = z.amax(1)
        theta = None if trunc is None else tile_threshold(z, zmax, trunc.rows(idx), ws)
        zc = torch.sub(z, zmax.unsqueeze(1), out=ws.get("tmp", c))
        e = torch.exp(zc, out=ws.get("e", c))
        if theta is not None:
            e.masked_fill_(torch.lt(z, theta.unsqueeze(1), out=ws.get("mask", c, torch.bool)), 0.0)
        s = e.sum(1)
        log_s = s.log()
        zy = z.gather(1, targets[idx].unsqueeze(1)).squeeze(1)
        logp[idx] = zy - zmax - log_s
        stats[0, idx], stats[1, idx] = zmax, log_s
        if theta is not None:
            stats[3, idx], outside[idx] = theta, zy < theta
        if entropy is not None:
            # −Σ_S p log p = log s − Σ_S e·(z − max)/s; a −inf logit has e = 0 and a finite stand-in for z − max
            h = log_s - zc.clamp_(min=torch.finfo(torch.float32).min).mul_(e).sum(1) / s
            entropy[idx], stats[2, idx] = h, h
        if topk:
            vals, ids = z.topk(topk, dim=1)
            lp = vals - (zmax + log_s).unsqueeze(1)
            if theta is not None:
                lp.masked_fill_(vals < theta.unsqueeze(1), float("-inf"))
            top_ids[idx], top_lp[idx] = ids, lp
    return SampledLogprobs(logp, entropy, outside, top_ids, top_lp), stats


def sampled_backward(hidden, weight, targets, bias, saved, grads, params, needs):
    """(d_hidden, d_weight, d_bias) with S held fixed: ∂z = g·(1[v=y] − p_S) − e·p_S·(log p_S + H), then through
    the temperature and the soft-cap. Walks the vocabulary (each chunk's ∂W rows complete in one GEMM) over the
    live rows; ignored rows get none. `saved` is the forward's (τ: a float or `[N]`, stats `[4, N]`), `grads` the
    upstream (∂/∂logp, ∂/∂entropy), each or None."""
    live = live_index(targets, params.ignore_index)
    if live is not None:
        row_args = (saved, grads, params, needs)
        return live_rows_backward(sampled_backward, live, hidden, weight, targets, bias, *row_args)
    (tau, stats), (grad_logp, grad_entropy) = saved, grads
    n, v, dev = hidden.shape[0], weight.shape[0], hidden.device
    cap, col = params.softcap, lambda t: t.unsqueeze(1)
    tau_c = col(tau) if isinstance(tau, torch.Tensor) else tau
    inv_tau = 1.0 / tau_c
    g = None if grad_logp is None else col(grad_logp.float()) * inv_tau  # τ folded into the row factors
    eg = None if grad_entropy is None else col(grad_entropy.float()).neg() * inv_tau
    lse, theta, ent = col(stats[0] + stats[1]), col(stats[3]), col(stats[2])
    h32 = hidden.float()
    d_hidden = torch.zeros(n, hidden.shape[1], dtype=torch.float32, device=dev) if needs[0] else None
    d_weight = torch.empty(weight.shape, dtype=weight.dtype, device=dev) if needs[1] else None
    d_bias = torch.empty(v, dtype=bias.dtype, device=dev) if needs[2] else None
    if g is not None:
        order = torch.argsort(targets)  # rows sorted by target id, to find each chunk's targets fast
        hits = targets[order]
    cols = max(64, chunk_bytes(n, v) // (12 * max(n, 1)))
    ws = Workspace(n, min(cols, v), dev)
    for start in range(0, v, cols):
        sl = slice(start, min(v, start + cols))
        c = sl.stop - sl.start
        buf = lambda name, dt=torch.float32: ws.get(name, n, dt)[:, :c] if c == ws.vocab else torch.empty(  # noqa: E731
            n, c, dtype=dt, device=dev)  # fmt: skip
        z = logit_tile(hidden, weight[sl], None if bias is None else bias[sl], softcap=cap, tau=tau, out=buf("z"))
        drop = torch.lt(z, theta, out=buf("mask", torch.bool))
        if cap is not None:
            factor = torch.mul(z, tau_c / cap, out=buf("f"))
            factor.square_().neg_().add_(1.0)  # 1 − tanh²(x / cap)
        logq = z.sub_(lse)
        p = torch.exp(logq, out=buf("p")).masked_fill_(drop, 0.0)
        if eg is not None:
            dz = logq.clamp_(min=torch.finfo(torch.float32).min).add_(ent).mul_(p).mul_(eg)
            if g is not None:
                dz.addcmul_(p, g, value=-1.0)
        elif g is not None:
            dz = p.mul_(-g)
        else:
            dz = p.zero_()
        if g is not None:
            add_target_hits(dz, sl, order, hits, targets, g[:, 0])
        slab_grads(dz if cap is None else dz.mul_(factor), sl, h32, weight, d_hidden, d_weight, d_bias)
    return None if d_hidden is None else d_hidden.to(hidden.dtype), d_weight, d_bias


class SampledLogprobFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, trunc, params: LogprobParams, topk):
        with no_autocast(hidden):
            out, stats = sampled_forward(hidden, weight, targets, bias, trunc, params, topk)
        ctx.params = params
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(hidden, weight, bias, targets, stats)
        extra = [t for t in (out.outside, out.topk_ids, out.topk_logprobs) if t is not None]
        ctx.mark_non_differentiable(*extra)
        return out.logp, out.entropy, *extra

    @staticmethod
    @differentiable_once  # the backward is hand-written: a second derivative must raise, not be wrong
    def backward(ctx, grad_logp, grad_entropy, *_):
        hidden, weight, bias, targets, stats = ctx.saved_tensors
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        if grad_logp is None and grad_entropy is None or not any(needs):
            return (None,) * 7
        saved = (ctx.params.temperature, stats)
        with no_autocast(hidden):
            d_hidden, d_weight, d_bias = sampled_backward(
                hidden, weight, targets, bias, saved, (grad_logp, grad_entropy), ctx.params, needs
            )
        return d_hidden, d_weight, d_bias, None, None, None, None


def _kernel_search(hidden, weight, targets, bias, trunc, params, topk):
    """(SampledLogprobs, θ `[N]`) of the Triton path's θ search, on the forward kernel's own logits; in blocks of
    a fixed row count when the call asks for batch invariance."""
    search = dataclasses.replace(params, return_entropy=False)
    tau = params.temperature

    def block(h, y, t, *rules):
        rows = None if trunc is None else Truncation(*rules)
        out, stats = sampled_forward(h, weight, y, bias, rows, dataclasses.replace(search, temperature=t), topk, True)
        return out.outside, out.topk_ids, out.topk_logprobs, stats[3]

    if not params.batch_invariant:
        *out, theta = block(hidden, targets, tau, *(trunc or (None,) * 3))
        return SampledLogprobs(None, None, *out), theta
    live = torch.nonzero(targets != params.ignore_index).squeeze(-1)
    if live.numel() == 0:
        return SampledLogprobs(None, None, torch.zeros_like(targets, dtype=torch.bool), None, None), None
    rules = tuple(zip(trunc or (None,) * 3, (0, 1.0, 0.0)))  # a padding row keeps every token
    row_tau = (tau, 1.0) if isinstance(tau, torch.Tensor) else (None, None)
    inputs = ((hidden, 0.0), (targets, 0), row_tau, *rules)
    rows = sampled_tile_rows(weight.shape[0])
    fn = block if isinstance(tau, torch.Tensor) else lambda h, y, _t, *r: block(h, y, tau, *r)
    *out, theta = run_blocks(fn, live, targets.shape[0], rows, inputs, fills=(False, 0, 0.0, float("-inf")))
    return SampledLogprobs(None, None, *out), theta


def token_logprobs_sampled(hidden, weight, targets, bias, trunc, params, impl, topk=None) -> SampledLogprobs:
    """`[N, D]` rows → SampledLogprobs of the truncated, soft-capped distribution (docs/math.md §8).

    params.temperature: a float or an `[N]` float32 tensor; trunc: per-row rules or None.
    impl "triton": θ (and the top-k export) from a no-grad pass here, skipped when neither is asked for; the
    log-probs and their gradients from the Triton kernels, a per-row tau riding in as their row scale 1/τ, applied
    after the soft-cap and the bias as the torch tile's division is (docs/math.md §1.1)."""
    if impl == "triton" and hidden.shape[0]:
        theta = out = None
        if trunc is not None or topk:
            with torch.no_grad(), no_autocast(hidden):
                out, theta = _kernel_search(hidden, weight, targets, bias, trunc, params, topk)
            theta = None if trunc is None else theta
        scalar, row_scale = kernel_temperature(params)
        logp, entropy = token_logprobs_triton(hidden, weight, targets, bias, scalar, theta=theta, row_scale=row_scale)
        if out is None:
            return SampledLogprobs(logp, entropy, torch.zeros_like(targets, dtype=torch.bool), None, None)
        return SampledLogprobs(logp, entropy, out.outside, out.topk_ids, out.topk_logprobs)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    if not grad:
        with no_autocast(hidden):
            return sampled_forward(hidden, weight, targets, bias, trunc, params, topk)[0]
    logp, entropy, outside, *top = SampledLogprobFunction.apply(hidden, weight, bias, targets, trunc, params, topk)
    return SampledLogprobs(logp, entropy, outside, *(top if top else (None, None)))


def sampled_path(c) -> SampledLogprobs:
    """The sampled path of a checked log-prob call (api.py's `_Call`)."""
    hidden = c.hidden.to(c.weight.dtype) if c.impl == "triton" else c.hidden  # the torch tiles upcast per chunk
    return token_logprobs_sampled(hidden, c.weight, c.targets.long(), c.bias, c.trunc, c.params, c.impl, c.return_topk)
