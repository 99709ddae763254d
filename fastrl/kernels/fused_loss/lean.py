"""The float32 CPU walk of the gradient-in-forward loss when the entropy is not needed (docs/math.md §7).

Three changes against chunked.py's fold, none to the math:
- the tile is vocab-major, `eᵀ [V, C]`: `W·hᵀ`, `(eᵀ)ᵀ·W` and `eᵀ·h` are the three GEMMs, the layouts MKL runs
  fastest on this shape (the row-major `h·Wᵀ` runs ~15% slower at a few hundred rows);
- each row is shifted by its target's logit, not its max: e = exp(z − z_y) holds e_y = 1, so s = Σ e ≥ 1 and
  log p_y = −log s, exact near p_y = 1 as with the max, without a pass for the max. A row whose s passes 2¹⁰⁰
  (p_y below ~e⁻⁶⁹, or a banned target) is redone with the max shift;
- ∂z = g·(onehot − e/s)/τ is never formed: the row factor −g/(s·τ) moves onto the `[C, D]` operands,
  d_hidden = (eᵀ)ᵀ·W·(−g/(sτ)) + (g/τ)·W_y and d_weight += eᵀ·(h·(−g/(sτ))) + onehotᵀ·(h·g/τ).
So a tile takes one exp pass and one sum besides the GEMMs.
"""

import torch

from .params import FusedLossParams

__all__ = ["lean_applies", "lean_forward"]

_S_MAX = 2.0**100  # above it, e/s and the GEMMs of e keep too little headroom: the row takes the max shift


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


def _logits_t(h, weight, bias, tau, out):
    # out = (W·hᵀ + b) / τ, [V, C]: a division, as eager's z / τ
    if bias is None:
        torch.mm(weight, h.T, out=out)
    else:
        torch.addmm(bias.unsqueeze(-1), weight, h.T, out=out)
    if isinstance(tau, torch.Tensor):
        out.div_(tau)
    elif tau != 1.0:
        out.div_(tau)
    return out


def _max_shift(e, s, z_y, shift, rows, h, weight, bias, tau, targets):
    """Rows whose target shift overflowed: z recomputed, e and s from z − max z instead, shift = max z."""
    tau_r = tau[rows] if isinstance(tau, torch.Tensor) else tau
    z = torch.empty(e.shape[0], rows.numel(), dtype=e.dtype, device=e.device)
    z = _logits_t(h.index_select(0, rows), weight, bias, tau_r, z)
    z_max = z.amax(0)
    z_y[rows] = z.gather(0, targets[rows].unsqueeze(0)).squeeze(0)
    shift[rows] = z_max
    e_rows = z.sub_(z_max).exp_()
    e[:, rows] = e_rows
    s[rows] = e_rows.sum(0)


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
    tile = torch.empty(v, min(rows, live.numel()), dtype=torch.float32, device=dev)
    for start in range(0, live.numel(), rows):
        idx = live[start : start + rows]
        c = idx.numel()
        h, y = hidden.index_select(0, idx), targets.index_select(0, idx)
        tau_c = tau.index_select(0, idx) if isinstance(tau, torch.Tensor) else tau
        e = _logits_t(h, weight, bias, tau_c, tile[:, :c])
        z_y = e.gather(0, y.unsqueeze(0)).squeeze(0)
        shift = z_y.clone()
        e.sub_(z_y).exp_()  # exp(z − z_y): the target's column is exactly 1
        s = e.sum(0)
        over = torch.nonzero(~(s <= _S_MAX)).squeeze(-1)  # NaN (a −inf or +inf target logit) lands here too
        if over.numel():
            _max_shift(e, s, z_y, shift, over, h, weight, bias, tau_c, y)
        logp_c = z_y - shift - s.log()
        logp.index_copy_(0, idx, logp_c)
        ew = torch.mm(e.T, weight) if d_hidden is not None else None  # Σ_v e_v W_v, [C, D]
        h_c = None
        if entropy is not None:
            h_c = _entropy(s, shift, h, ew, e, bias, tau_c)
            entropy.index_copy_(0, idx, h_c)
        g, g_entropy = token_grad(idx, logp_c, h_c)
        if g_entropy is not None:
            raise RuntimeError("lean_forward: token_grad returned ∂L/∂H for a loss declared without entropy gradient")
        g_tau = (g / tau_c).unsqueeze(-1)  # ∂L/∂z = g_tau·(onehot − e/s)
        neg = -g_tau / s.unsqueeze(-1)
        if d_hidden is not None:
            d_hidden.index_copy_(0, idx, ew.mul_(neg).add_(weight.index_select(0, y) * g_tau))
        if d_weight is not None:
            d_weight.addmm_(e, h * neg).index_add_(0, y, h * g_tau)
        if d_bias is not None:
            d_bias.addmv_(e, neg.squeeze(-1)).index_add_(0, y, g_tau.squeeze(-1))
    return logp, entropy, (d_hidden, d_weight, d_bias)
