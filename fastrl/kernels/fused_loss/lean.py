"""The float32 CPU walk of the gradient-in-forward loss when the entropy takes no gradient (docs/math.md §7).

Two changes against chunked.py's fold, none to the math: the tile is vocab-major and shifted by the target
logit (logprobs/vocab_major.py: the fastest GEMM layouts on the CPU, no pass for the max), and ∂z =
g·(onehot − e/s)/τ is never formed: the row factor −g/(s·τ) moves onto the `[C, D]` operands,
d_hidden = (eᵀ)ᵀ·W·(−g/(sτ)) + (g/τ)·W_y and d_weight += eᵀ·(h·(−g/(sτ))) + onehotᵀ·(h·g/τ). A tile takes
one exp pass and one sum besides the three GEMMs. An entropy metric comes from the d_hidden GEMM's product:
H = log s + shift − (h·Σ_v e_v W_v + Σ_v e_v b_v)/(τ·s).
"""

import torch

from ..logits import logit_tile
from ..logprobs.invariant import pad_rows
from ..logprobs.vocab_major import shifted_exp_t, tile_t, vocab_major_rows
from .params import FusedLossParams

__all__ = ["lean_applies", "lean_forward"]


def lean_applies(hidden: torch.Tensor, weight: torch.Tensor, params: FusedLossParams) -> bool:
    """This walk serves float32 torch-impl calls on the CPU whose loss takes no gradient through the entropy
    (an entropy metric comes from the d_hidden GEMM's product, so that gradient must be wanted then)."""
    entropy_ok = not params.entropy or (not params.entropy_grad and params.needs[0])
    return (
        params.impl == "torch"
        and entropy_ok
        and hidden.device.type == "cpu"
        and hidden.dtype == weight.dtype == torch.float32
    )


def _entropy(s, shift, h, ew, e, bias, tau):
    # H = log s + shift − E_p[z], E_p[z] = (h·Σ_v e_v W_v + Σ_v e_v b_v) / (τ·s): the d_hidden GEMM's product.
    # Exact in exact arithmetic; in float32 off by a few ulps of the logits (a metric, never differentiated)
    mean_z = (h * ew).sum(-1)
    if bias is not None:
        mean_z += torch.mv(e.T, bias)
    return (s.log() + shift - mean_z.div_(s).div_(tau)).clamp_(min=0.0)


def lean_forward(hidden, weight, bias, targets, tau, token_grad, params: FusedLossParams, rows: int):
    """chunked.fused_forward's contract (entropy None), on `rows`-token tiles; see the module docstring."""
    n, d = hidden.shape
    v, dev = weight.shape[0], hidden.device
    live = torch.nonzero(targets >= 0).squeeze(-1)
    logp = torch.zeros(n, dtype=torch.float32, device=dev)
    need_h, need_w, need_b = params.needs
    d_hidden = torch.zeros(n, d, dtype=torch.float32, device=dev) if need_h else None
    d_weight = torch.zeros(v, d, dtype=torch.float32, device=dev) if need_w else None
    d_bias = torch.zeros(v, dtype=torch.float32, device=dev) if need_b else None
    entropy = torch.zeros(n, dtype=torch.float32, device=dev) if params.entropy else None
    rows = vocab_major_rows(rows)
    # batch invariance: every tile and GEMM of one shape, the last chunk padded with zero rows (chunked.py)
    tile = tile_t(v, rows if params.batch_invariant else min(rows, live.numel()), dev)
    for start in range(0, live.numel(), rows):
        idx = live[start : start + rows]
        c = idx.numel()
        pad = tile.shape[1] - c if params.batch_invariant else 0
        h, y = pad_rows(hidden.index_select(0, idx), pad, 0.0), pad_rows(targets.index_select(0, idx), pad, 0)
        tau_c = pad_rows(tau.index_select(0, idx), pad, 1.0) if isinstance(tau, torch.Tensor) else tau
        e = logit_tile(h, weight, bias, tau=tau_c, out=tile[:, : c + pad], vocab_major=True)
        z_y, shift, s = shifted_exp_t(e, h, weight, bias, tau_c, y)
        logp_c = z_y - shift - s.log()
        logp.index_copy_(0, idx, logp_c[:c])
        ew = torch.mm(e.T, weight) if d_hidden is not None else None  # Σ_v e_v W_v, [C, D]
        h_c = None
        if entropy is not None:
            h_c = _entropy(s, shift, h, ew, e, bias, tau_c)
            entropy.index_copy_(0, idx, h_c[:c])
        g, g_entropy = token_grad(idx, logp_c[:c], None if h_c is None else h_c[:c])
        if g_entropy is not None:
            raise RuntimeError("lean_forward: token_grad returned ∂L/∂H for a loss declared without entropy gradient")
        g = pad_rows(g, pad, 0.0)
        g_tau = (g / tau_c).unsqueeze(-1)  # ∂L/∂z = g_tau·(onehot − e/s)
        neg = -g_tau / s.unsqueeze(-1)
        if d_hidden is not None:
            d_hidden.index_copy_(0, idx, ew.mul_(neg).add_(weight.index_select(0, y) * g_tau)[:c])
        if d_weight is not None:
            d_weight.addmm_(e, h * neg).index_add_(0, y, h * g_tau)
        if d_bias is not None:
            d_bias.addmv_(e, neg.squeeze(-1)).index_add_(0, y, g_tau.squeeze(-1))
    return logp, entropy, (d_hidden, d_weight, d_bias)
