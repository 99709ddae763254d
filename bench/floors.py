"""The GEMM floors: the least a fused LM-head op must do, timed as providers but never correctness-checked.

`blas-floor` is the three GEMMs of the shape (z = h·Wᵀ, z·W and zᵀ·h: 6·N·D·V), `recompute-floor` four (the
forward GEMM again in the backward: 8·N·D·V, the least an op that keeps no `[N, V]` tensor between forward
and backward must do). Both run over the LIVE rows only (the rows a candidate has to score), in tiles of C
rows through one reused buffer with `out=` / `addmm_` GEMMs and nothing else. The buffer holds either z
(`[C, V]`, layout "z") or zᵀ (`[V, C]`, layout "zT"); BLAS runs the two at different rates. A floor must be
the best we know how to do, so the first call at a shape times every (layout, C) with C in `TILE_ROWS` and
the whole batch, twice each, keeps each one's faster time and picks the fastest; `CHOSEN[(n, d, v, kind)]`
records the pick for the report.
"""

import time

import torch

TILE_ROWS = (256, 512, 1024, 2048, 4096)
LAYOUTS = ("z", "zT")
CHOSEN: dict = {}  # (n, d, v, "blas" | "recompute") -> (layout, rows)


def _tile(buf, layout: str, c: int, v: int):
    """The buffer's first c rows (z `[c, V]`) or columns (zᵀ `[V, c]`), contiguous either way."""
    return buf.view(-1)[: c * v].view(c, v) if layout == "z" else buf.view(-1)[: c * v].view(v, c)


def _logits(h_t, w, z, layout: str) -> None:
    if layout == "z":
        torch.mm(h_t, w.T, out=z)
    else:
        torch.mm(w, h_t.T, out=z)


def _gemms(h, w, layout: str, rows: int, grads=None) -> None:
    """z per tile; with `grads` (dh, dw) also dh = z·W and dw += zᵀ·h (three GEMMs)."""
    n, v = h.shape[0], w.shape[0]
    buf = torch.empty(min(rows, n) * v, dtype=h.dtype, device=h.device)
    for s in range(0, n, rows):
        h_t = h[s : s + rows]
        z = _tile(buf, layout, h_t.shape[0], v)
        _logits(h_t, w, z, layout)
        if grads is None:
            continue
        dh, dw = grads
        if layout == "z":
            torch.mm(z, w, out=dh[s : s + rows])
            dw.addmm_(z.T, h_t)
        else:
            torch.mm(z.T, w, out=dh[s : s + rows])
            dw.addmm_(z, h_t)


def _run(h, w, kind: str, layout: str, rows: int) -> None:
    if kind == "recompute":
        _gemms(h, w, layout, rows)
    _gemms(h, w, layout, rows, (torch.empty_like(h), torch.zeros_like(w)))


def candidates(n: int) -> list[tuple[str, int]]:
    """Every (layout, rows per tile) the calibration times for `n` rows."""
    heights = sorted({min(r, n) for r in TILE_ROWS} | {n})
    return [(layout, rows) for layout in LAYOUTS for rows in heights]


def best_tiling(h, w, kind: str) -> tuple[str, int]:
    """The fastest (layout, rows) for this shape and kind, timed on the first call and remembered."""
    key = (h.shape[0], h.shape[1], w.shape[0], kind)
    if key not in CHOSEN:
        times = {c: float("inf") for c in candidates(h.shape[0])}
        for _ in range(2):  # two rounds, so a burst of load hits every candidate at most once
            for layout, rows in times:
                t0 = time.perf_counter()
                _run(h, w, kind, layout, rows)
                times[layout, rows] = min(times[layout, rows], time.perf_counter() - t0)
        CHOSEN[key] = min(times, key=times.get)
    return CHOSEN[key]


class _Floor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, recompute: bool):
        h = hidden.detach()
        w = weight.detach()
        layout, rows = best_tiling(h, w, "recompute" if recompute else "blas")
        ctx.recompute, ctx.tiling = recompute, (layout, rows)
        if recompute:
            _gemms(h, w, layout, rows)  # the forward: logits only
            ctx.save_for_backward(h, w)
        else:
            dh, dw = torch.empty_like(h), torch.zeros_like(w)
            _gemms(h, w, layout, rows, (dh, dw))  # gradient in the forward
            ctx.save_for_backward(dh, dw)
        return h.new_zeros(h.shape[0])

    @staticmethod
    def backward(ctx, grad):
        if ctx.recompute:
            h, w = ctx.saved_tensors
            dh, dw = torch.empty_like(h), torch.zeros_like(w)
            _gemms(h, w, *ctx.tiling, (dh, dw))
            return dh, dw, None
        dh, dw = ctx.saved_tensors
        return dh, dw, None


def blas_floor(hidden, weight):
    """Three GEMMs over `hidden`'s rows ([N_live, D]); returns zeros [N_live] wired to the floor's gradients."""
    return _Floor.apply(hidden, weight, False)


def recompute_floor(hidden, weight):
    """Four GEMMs over `hidden`'s rows: the logits in the forward, again in the backward with the two others."""
    return _Floor.apply(hidden, weight, True)


def tilings_line() -> str:
    """The report's line naming each floor's pick, e.g. `N_live=7772 D=512 V=32768 blas: zT, 512 rows`."""
    return (
        f"- floor tilings (layout z `[C, V]` or zT `[V, C]` × rows per tile C in {', '.join(map(str, TILE_ROWS))} "
        "and the whole batch, each timed twice, the fastest kept): "
        + ", ".join(f"N_live={k[0]} D={k[1]} V={k[2]} {k[3]}: {lay}, {rows} rows" for k, (lay, rows) in CHOSEN.items())
    )
