"""The vocab-major float32 tile of the CPU walks: `eᵀ [V, C]`, each row shifted by its target's logit.

On the CPU (MKL), `W·hᵀ` into a `[V, C]` buffer, then `(eᵀ)ᵀ·W` and `eᵀ·h`, are the GEMM layouts that run
fastest at a few hundred rows; the row-major `h·Wᵀ` runs ~15% slower there. Each row is shifted by its target
logit, not its max: e = exp(z − z_y) holds e_y = 1 exactly, so s = Σ e ≥ 1 and log p_y = −log s keeps full
precision near p_y = 1, as the max shift does, without a pass for the max. A row whose s passes 2¹⁰⁰ (a target
with p_y below ~e⁻⁶⁹, or a banned one) is redone with the max shift, from a second GEMM of the whole tile. Used
by chunked.py's forward and the gradient-in-forward loss (`lean_forward`, fused_loss/api.py).
"""

import torch

from ..logits import logit_tile

__all__ = ["S_MAX", "shifted_exp_t", "tile_t", "vocab_major_rows"]

S_MAX = 2.0**100  # above it, e / s and the GEMMs of e keep too little headroom: the row takes the max shift


def vocab_major_rows(rows: int) -> int:
    """Tokens per vocab-major tile: a multiple of 64 (an unaligned row stride, e.g. 971 floats, runs MKL's
    `W·hᵀ` ~35% slower than 960 or 1024 on this CPU)."""
    return max(64, rows // 64 * 64)


def tile_t(vocab: int, rows: int, device) -> torch.Tensor:
    """A float32 `[vocab, rows]` buffer whose row stride is rounded up to 16 floats (64 bytes)."""
    return torch.empty(vocab, -(-rows // 16) * 16, dtype=torch.float32, device=device)[:, :rows]


def shifted_exp_t(e, h, weight, bias, tau, targets):
    """In place, the vocab-major logits `e = logit_tile(h, ..., vocab_major=True)` become exp(z − shift); returns
    (z_y, shift, s), each `[C]`.

    shift is z_y, or max z for the rows whose s would pass S_MAX (recomputed from h), so that
    log p_y = z_y − shift − log s and p_v = e_v / s.
    """
    z_y = e.gather(0, targets.unsqueeze(0)).squeeze(0)
    shift = z_y.clone()
    e.sub_(z_y).exp_()  # the target's column is exactly 1
    s = e.sum(0)
    over = torch.nonzero(~(s <= S_MAX)).squeeze(-1)  # NaN (a −inf or +inf target logit) lands here too
    if over.numel():
        # the whole tile again, then its `over` columns: a GEMM of the tile's own shape gives a row the bits it
        # gets however many rows overflow beside it (batch invariance, docs/math.md §1.2)
        z = logit_tile(h, weight, bias, tau=tau, out=tile_t(*e.shape, e.device), vocab_major=True)
        z = z.index_select(1, over)
        z_max = z.amax(0)
        z_y[over] = z.gather(0, targets[over].unsqueeze(0)).squeeze(0)
        shift[over] = z_max
        e_rows = z.sub_(z_max).exp_()
        e[:, over] = e_rows
        s[over] = e_rows.sum(0)
    return z_y, shift, s
