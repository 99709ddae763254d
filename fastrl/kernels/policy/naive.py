"""Pure-PyTorch per-token policy loss (docs/math.md §2): the reference and the CPU path of the fused kernel.

Both implementations return the same two things for a `[B, T]` batch:
  row_loss `[B]`   Σ_t m·ℓ per sequence, differentiable w.r.t. logprobs (and entropy);
  stats `[B, K]`   detached per-sequence masked sums, columns named by `STATS`.
Aggregation over sequences (docs/math.md §3) happens on these `[B]` vectors, outside the kernel.

Masked positions may hold anything (padding, inf, NaN): every input is replaced by a neutral value
there BEFORE any exp, so neither the loss nor the gradient can pick up 0·inf.
"""

import torch

from .params import STATS, PolicyLossParams

__all__ = ["kl_term", "policy_rows_torch"]


def kl_term(rho: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate from ρ = logp_ref − logp."""
    if kind == "k1":
        return -rho
    if kind == "k2":
        return 0.5 * rho * rho
    if rho.dtype == torch.float64:
        return torch.expm1(rho) - rho
    # In fp32 autograd's exp(ρ)·g − g cancels for small ρ (1% off at |ρ| ~ 1e-4): the kernel's Taylor
    # series there (truncation < 1e-6 relative), value and gradient alike
    q = 1.0 / 24 + rho * (1.0 / 120 + rho * (1.0 / 720 + rho / 5040))
    q = 0.5 + rho * (1.0 / 6 + rho * q)
    return torch.where(rho.abs() < 0.5, rho * rho * q, torch.expm1(rho) - rho)


def policy_rows_torch(logp, advantages, mask, old, ref, rollout, entropy, params: PolicyLossParams):
    """`[B, T]` inputs (advantages `[B]` or `[B, T]`; optional ones None) → (row_loss `[B]`, stats `[B, K]`).

    Computes in float32 (float64 when logp is float64). old/ref/rollout/advantages are constants.
    """
    dt = torch.float64 if logp.dtype == torch.float64 else torch.float32
    m = mask if mask.dtype == torch.bool else mask != 0
    mf = m.to(dt)
    lp = torch.where(m, logp.to(dt), 0.0)
    adv = advantages.detach().to(dt)
    adv = torch.where(m, adv if adv.dim() == 2 else adv.unsqueeze(-1), 0.0)
    old_c = lp.detach() if old is None else torch.where(m, old.detach().to(dt), 0.0)
    delta = lp - old_c
    if params.seq_ratio:
        log_r = (delta.sum(-1, keepdim=True) / mf.sum(-1, keepdim=True).clamp(min=1)).expand_as(delta)
    else:
        log_r = delta
    r = torch.exp(log_r.detach())
    lo, hi = 1.0 - params.eps_low, 1.0 + params.eps_high
    # pg = −min(r·A, clip(r)·A) = −clip(r)·A (a constant) where a clip binds, −r·A elsewhere. Only the
    # live tokens' ratio goes through exp with a gradient: a bound token whose r overflowed to inf
    # gets exactly 0, not 0·inf = NaN, as in the kernel.
    binds = ((r < lo) & (adv < 0)) | ((r > hi) & (adv > 0))
    pg_bound = -r.clamp(lo, hi) * adv
    zero = torch.zeros_like(mf)
    # masked positions (A = 0 there) are frozen too: GSPO gives them the row's r, which may be inf. So is
    # any A = 0 token: its term is 0 whatever r is, but r·A with r = exp(89) = inf would be inf·0 = NaN.
    frozen, clip_dual = binds | ~m | (adv == 0), zero
    if params.dual_clip is not None:
        cap = -params.dual_clip * adv
        dual = (adv < 0) & (torch.where(binds, pg_bound, -r * adv) > cap)
        clip_dual = (dual & m).to(dt)
        pg_bound = torch.where(dual, cap, pg_bound)
        frozen = frozen | dual
    r_live = torch.exp(torch.where(frozen, 0.0, log_r))
    pg = torch.where(frozen, pg_bound, -r_live * adv)
    w = torch.ones_like(mf)
    if rollout is not None:
        log_w = torch.where(m, old_c.detach() - rollout.detach().to(dt), 0.0)
        w = torch.exp(log_w).clamp(max=params.is_cap)
        pg = w * pg
    loss = pg
    kl = zero
    if ref is not None:
        kl = kl_term(torch.where(m, ref.detach().to(dt), 0.0) - lp, params.kl)
        if params.beta != 0:
            loss = loss + params.beta * kl
    h = zero
    if entropy is not None:
        h = torch.where(m, entropy.to(dt), 0.0)
        if params.entropy_coef != 0:
            loss = loss - params.entropy_coef * h
    row_loss = (loss * mf).sum(-1)
    with torch.no_grad():
        cols = {
            "tokens": mf,
            "clip_low": (m & (r < lo) & (adv < 0)).to(dt),
            "clip_high": (m & (r > hi) & (adv > 0)).to(dt),
            "clip_dual": clip_dual,
            "ratio": r * mf,
            "log_ratio_abs": log_r.abs() * mf,
            "kl": kl * mf,
            "entropy": h * mf,
            "is_weight": w * mf,
        }
        stats = torch.stack([cols[name].sum(-1) for name in STATS], dim=-1).float()
    return row_loss.float() if dt == torch.float32 else row_loss, stats
