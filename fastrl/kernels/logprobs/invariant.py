"""Batch invariance of the PyTorch walks (docs/math.md §1.2): a row-local function run on blocks of a fixed number
of live rows.

A library GEMM's result for one row depends on the GEMM's shape (MKL and cuBLAS pick kernels, blockings and K
splits by it), not on where the row sits in it; a reduction over a row alone may split it across threads. So a
walk asked for invariance runs on blocks of exactly `invariant_rows` live rows, the last one padded with zero rows,
and takes each block as one tile: every tile, GEMM and row reduction then has one shape per vocabulary size,
whatever N and whichever rows share the call.
"""

import torch

from ..budgets import INVARIANT_MAX_ROWS
from .chunked import chunk_bytes

__all__ = ["invariant_rows", "pad_rows", "run_blocks"]


def invariant_rows(vocab: int, bytes_per_logit: int = 4, multiple: int = 64) -> int:
    """Rows per block: the chunk budget's tile of `bytes_per_logit` bytes per logit, a multiple of `multiple`
    (the vocab-major tile's 64), at most 1024, never a function of the token count."""
    rows = min(INVARIANT_MAX_ROWS, chunk_bytes() // (bytes_per_logit * max(vocab, 1)))
    return max(multiple, rows // multiple * multiple)


def pad_rows(t: torch.Tensor, pad: int, value) -> torch.Tensor:
    """t with `pad` more rows (dim 0) of `value` (t itself when pad is 0)."""
    if pad == 0:
        return t
    return torch.cat([t, t.new_full((pad, *t.shape[1:]), value)])


def run_blocks(fn, live: torch.Tensor, n: int, rows: int, inputs, fills=None):
    """`fn(*block)` on each block of `rows` rows of the `live` indices (`[L]` int64, out of n rows), the last block
    padded; its outputs (a tuple of tensors with rows in dim 0, or None) put back at the live rows of n.

    Args:
        inputs: (tensor or None, pad value) pairs, each tensor's dim 0 the n rows; a block gets its rows, padded
            with the value (None stays None).
        fills: the value of each output at the rows off `live` (default 0).

    Returns:
        a tuple of `[n, ...]` tensors (None where fn gave None), differentiable through fn.
    """
    done = []
    for start in range(0, live.numel(), rows):
        idx = live[start : start + rows]
        pad = rows - idx.numel()
        block = [None if t is None else pad_rows(t.index_select(0, idx), pad, value) for t, value in inputs]
        done.append((idx.numel(), fn(*block)))
    outs = []
    for k, first in enumerate(done[0][1]):
        if first is None:
            outs.append(None)
            continue
        vals = torch.cat([out[k][:c] for c, out in done])
        fill = 0 if fills is None else fills[k]
        base = torch.full((n, *first.shape[1:]), fill, dtype=first.dtype, device=first.device)
        outs.append(base.index_copy(0, live, vals))
    return tuple(outs)
