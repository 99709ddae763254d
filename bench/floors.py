"""The GEMM floors: the least a fused LM-head op must do, timed as providers but never correctness-checked.

`blas-floor` is the three GEMMs of the shape (z = h·Wᵀ, z·W and zᵀ·h: 6·N·D·V), `recompute-floor` four (the
forward GEMM again in the backward: 8·N·D·V, the least an op that keeps no `[N, V]` tensor between forward
and backward must do). Both run over the LIVE rows only (the rows a candidate has to score), through one
reused buffer with `out=` / `addmm_` GEMMs and nothing else, in one of three tilings that BLAS runs at
different rates: row tiles holding z (`[C, V]`, layout "z") or zᵀ (`[V, C]`, layout "zT"), or vocabulary
slabs (`[N, C_v]`, layout "v", d_weight complete per slab and d_hidden accumulated). A floor must be the best
we know how to do, so the first call at a shape times every tiling of the logits alone ("logits") and of
the three GEMMs ("3 GEMMs"): each once, then the three fastest again, keeping each one's faster time. The
blas floor runs the best "3 GEMMs" tiling; the recompute floor the best "logits" tiling, then the best
"3 GEMMs" one (the two need not agree, as an op's forward and backward need not). `CHOSEN[(n, d, v, part)]`
records each pick for the report.
"""

import time

import torch

TILE_ROWS = (512, 1024, 2048)
VOCAB_COLS = (2048, 4096, 8192)
LAYOUTS = ("z", "zT", "v")
PARTS = ("logits", "3 GEMMs")
CHOSEN: dict = {}  # (n, d, v, part) -> (layout, rows per tile or vocabulary columns per slab)


def _view(buf, rows: int, cols: int):
    """The buffer's first rows·cols elements as a contiguous `[rows, cols]` tensor."""
    return buf.view(-1)[: rows * cols].view(rows, cols)


def _row_tiles(h, w, layout: str, rows: int, grads) -> None:
    n, v = h.shape[0], w.shape[0]
    buf = torch.empty(min(rows, n) * v, dtype=h.dtype, device=h.device)
    for s in range(0, n, rows):
        h_t = h[s : s + rows]
        c = h_t.shape[0]
        if layout == "z":
            z = torch.mm(h_t, w.T, out=_view(buf, c, v))
        else:
            z = torch.mm(w, h_t.T, out=_view(buf, v, c)).T
        if grads is not None:
            dh, dw = grads
            torch.mm(z, w, out=dh[s : s + rows])
            dw.addmm_(z.T, h_t)


def _vocab_slabs(h, w, cols: int, grads) -> None:
    n, v = h.shape[0], w.shape[0]
    buf = torch.empty(n * min(cols, v), dtype=h.dtype, device=h.device)
    for s in range(0, v, cols):
        w_s = w[s : s + cols]
        z = torch.mm(h, w_s.T, out=_view(buf, n, w_s.shape[0]))
        if grads is not None:
            dh, dw = grads
            torch.mm(z.T, h, out=dw[s : s + cols])
            dh.addmm_(z, w_s)


def _gemms(h, w, layout: str, size: int, grads=None) -> None:
    """z in the tiling (layout, size); with `grads` (dh, dw, zero-filled) also dh = z·W and dw = zᵀ·h."""
    if layout == "v":
        _vocab_slabs(h, w, size, grads)
    else:
        _row_tiles(h, w, layout, size, grads)


def candidates(n: int, v: int) -> list[tuple[str, int]]:
    """Every (layout, size) the calibration times for `n` rows and a `v`-token vocabulary."""
    heights = sorted({min(r, n) for r in TILE_ROWS} | {n})
    widths = sorted({min(c, v) for c in VOCAB_COLS})
    return [(lay, r) for lay in ("z", "zT") for r in heights] + [("v", c) for c in widths]


def _zeros(h, w):
    return torch.zeros_like(h), torch.zeros_like(w)


def best_tiling(h, w, part: str) -> tuple[str, int]:
    """The fastest (layout, size) for this shape and part ("logits" or "3 GEMMs"), timed once and remembered."""
    key = (h.shape[0], h.shape[1], w.shape[0], part)
    if key not in CHOSEN:
        times = {}

        def time_it(c):
            grads = _zeros(h, w) if part == "3 GEMMs" else None
            t0 = time.perf_counter()
            _gemms(h, w, *c, grads)
            times[c] = min(times.get(c, float("inf")), time.perf_counter() - t0)

        for c in candidates(h.shape[0], w.shape[0]):
            time_it(c)
        for c in sorted(times, key=times.get)[:3]:  # a second round for the front-runners: a burst of load
            time_it(c)  # hits one of them at most once
        CHOSEN[key] = min(times, key=times.get)
    return CHOSEN[key]


class _Floor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, recompute: bool):
        h = hidden.detach()
        w = weight.detach()
        three = best_tiling(h, w, "3 GEMMs")
        ctx.recompute, ctx.three = recompute, three
        if recompute:
            _gemms(h, w, *best_tiling(h, w, "logits"))  # the forward: logits only
            ctx.save_for_backward(h, w)
        else:
            dh, dw = _zeros(h, w)
            _gemms(h, w, *three, (dh, dw))  # gradient in the forward
            ctx.save_for_backward(dh, dw)
        return h.new_zeros(h.shape[0])

    @staticmethod
    def backward(ctx, grad):
        if ctx.recompute:
            h, w = ctx.saved_tensors
            dh, dw = _zeros(h, w)
            _gemms(h, w, *ctx.three, (dh, dw))
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
    """The report's line naming each pick, e.g. `N_live=7772 D=512 V=32768 3 GEMMs: zT, 512`."""
    return (
        f"- floor tilings (row tiles z `[C, V]` or zT `[V, C]`, C in {', '.join(map(str, TILE_ROWS))} and the whole "
        f"batch, or vocabulary slabs v `[N, C_v]`, C_v in {', '.join(map(str, VOCAB_COLS))}; each timed, the three "
        "fastest again, the fastest kept): "
        + ", ".join(f"N_live={k[0]} D={k[1]} V={k[2]} {k[3]}: {lay}, {size}" for k, (lay, size) in CHOSEN.items())
    )
