"""The GEMM floors: the least a fused LM-head op must do, timed as providers but never correctness-checked.

`blas-floor` is the three GEMMs of the shape (z = h·Wᵀ, z·W and zᵀ·h: 6·N·D·V), `recompute-floor` four (the
forward GEMM again in the backward: 8·N·D·V, the least an op that keeps no `[N, V]` tensor between forward
and backward must do). Both run over the LIVE rows only (the rows a candidate has to score), in row tiles
through one reused `[C, V]` buffer with `out=` / `addmm_` GEMMs and nothing else. An honest floor is the
best tiling, not one guess: the first call at a shape times each tile height once (`TILE_ROWS` and the
whole batch) and keeps the fastest; `CHOSEN[(n, d, v, kind)]` records it for the report.
"""

import time

import torch

TILE_ROWS = (256, 512, 1024, 2048, 4096)
CHOSEN: dict = {}


def _gemms3(h, w, rows, dh, dw):
    buf = torch.empty(min(rows, h.shape[0]), w.shape[0], dtype=h.dtype, device=h.device)
    for s in range(0, h.shape[0], rows):
        h_t = h[s : s + rows]
        z = buf[: h_t.shape[0]]
        torch.mm(h_t, w.T, out=z)
        torch.mm(z, w, out=dh[s : s + rows])
        dw.addmm_(z.T, h_t)


def _gemms1(h, w, rows):
    buf = torch.empty(min(rows, h.shape[0]), w.shape[0], dtype=h.dtype, device=h.device)
    for s in range(0, h.shape[0], rows):
        h_t = h[s : s + rows]
        torch.mm(h_t, w.T, out=buf[: h_t.shape[0]])


def _best_rows(h, w, kind: str) -> int:
    key = (h.shape[0], h.shape[1], w.shape[0], kind)
    if key not in CHOSEN:
        times = {}
        for rows in sorted({min(r, h.shape[0]) for r in TILE_ROWS} | {h.shape[0]}):
            dh, dw = torch.empty_like(h), torch.zeros_like(w)
            t0 = time.perf_counter()
            _gemms1(h, w, rows) if kind == "recompute" else None
            _gemms3(h, w, rows, dh, dw)
            times[rows] = time.perf_counter() - t0
        CHOSEN[key] = min(times, key=times.get)
    return CHOSEN[key]


class _Floor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, recompute: bool):
        h = hidden.detach()
        w = weight.detach()
        rows = _best_rows(h, w, "recompute" if recompute else "blas")
        ctx.recompute, ctx.rows = recompute, rows
        if recompute:
            _gemms1(h, w, rows)  # the forward: logits only
            ctx.save_for_backward(h, w)
        else:
            dh, dw = torch.empty_like(h), torch.zeros_like(w)
            _gemms3(h, w, rows, dh, dw)  # gradient in the forward
            ctx.save_for_backward(dh, dw)
        return h.new_zeros(h.shape[0])

    @staticmethod
    def backward(ctx, grad):
        if ctx.recompute:
            h, w = ctx.saved_tensors
            dh, dw = torch.empty_like(h), torch.zeros_like(w)
            _gemms3(h, w, ctx.rows, dh, dw)
            return dh, dw, None
        dh, dw = ctx.saved_tensors
        return dh, dw, None


def blas_floor(hidden, weight):
    """Three GEMMs over `hidden`'s rows ([N_live, D]); returns zeros [N_live] wired to the floor's gradients."""
    return _Floor.apply(hidden, weight, False)


def recompute_floor(hidden, weight):
    """Four GEMMs over `hidden`'s rows: the logits in the forward, again in the backward with the two others."""
    return _Floor.apply(hidden, weight, True)
