"""Pure-PyTorch per-token policy loss (docs/math.md §2): the reference and the CPU path of the fused kernel.

Both implementations return the same two things for a `[B, T]` batch:
  row_loss `[B]`   Σ_t m·ℓ per sequence, differentiable w.r.t. logprobs (and entropy);
  stats `[B, K]`   detached per-sequence masked sums, columns named by `STATS`.
Aggregation over sequences (docs/math.md §3) happens on these `[B]` vectors, outside the kernel.

Masked positions may hold anything (padding, inf, NaN): every input is replaced by a neutral value
there BEFORE any exp, so neither the loss nor the gradient can pick up 0·inf.
"""

import torch

from .params import SAPO_SATURATED, STATS, PolicyLossParams

__all__ = ["kl_term", "policy_rows_torch"]


def kl_term(rho: torch.Tensor, kind: str, clip: float | None) -> torch.Tensor:
    """Per-token KL estimate from ρ = logp_ref − logp (differentiable through ρ)."""
    base = kind.rstrip("+")
    if base == "k1":
        kl = -rho
    elif base == "k2":
        kl = 0.5 * rho * rho
    elif base == "abs":
        kl = rho.abs()
    elif rho.dtype == torch.float64:
        kl = torch.expm1(rho) - rho
    else:
        # In fp32 autograd's exp(ρ)·g − g cancels for small ρ (1% off at |ρ| ~ 1e-4): the kernel's Taylor
        # series there (truncation < 1e-6 relative), value and gradient alike
        q = 1.0 / 24 + rho * (1.0 / 120 + rho * (1.0 / 720 + rho / 5040))
        q = 0.5 + rho * (1.0 / 6 + rho * q)
        kl = torch.where(rho.abs() < 0.5, rho * rho * q, torch.expm1(rho) - rho)
    if clip is not None:
        kl = kl.clamp(-clip, clip)
    if kind.endswith("+"):
        # straight-through: the value of the estimate, the gradient of k2 = ρ²/2
        k2 = 0.5 * rho * rho
        kl = k2 - k2.detach() + kl.detach()
    return kl


def _log_ratio(lp, old_c, m, mf, level):
    delta = lp - old_c
    if level == "token":
        return delta
    seq = delta.sum(-1, keepdim=True) / mf.sum(-1, keepdim=True).clamp(min=1)
    if level == "sequence":
        return seq.expand_as(delta)
    # GSPO-token: the sequence ratio's value, each token's own gradient
    return torch.where(m, lp - lp.detach() + seq.detach(), 0.0)


def _clip_pg(r, log_r, adv, m, params):
    lo, hi = 1.0 - params.eps_low, 1.0 + params.eps_high
    # pg = −min(r·A, clip(r)·A) = −clip(r)·A (a constant) where a clip binds, −r·A elsewhere. Only the
    # live tokens' ratio goes through exp with a gradient: a bound token whose r overflowed to inf
    # gets exactly 0, not 0·inf = NaN, as in the kernel.
    binds = ((r < lo) & (adv < 0)) | ((r > hi) & (adv > 0))
    pg_bound = -r.clamp(lo, hi) * adv
    # masked positions (A = 0 there) are frozen too: GSPO gives them the row's r, which may be inf
    frozen, dual = binds | ~m, torch.zeros_like(m)
    if params.dual_clip is not None:
        cap = -params.dual_clip * adv
        dual = (adv < 0) & (torch.where(binds, pg_bound, -r * adv) > cap)
        pg_bound = torch.where(dual, cap, pg_bound)
        frozen = frozen | dual
    r_live = torch.exp(torch.where(frozen, 0.0, log_r))
    return torch.where(frozen, pg_bound, -r_live * adv), dual & m


def _sapo_pg(r, log_r, adv, m, params):
    tau = torch.where(adv > 0, adv.new_tensor(params.sapo_tau_pos), adv.new_tensor(params.sapo_tau_neg))
    z = tau * (r - 1)
    frozen = (z > SAPO_SATURATED) | ~m
    r_live = torch.exp(torch.where(frozen, 0.0, log_r))
    gate = torch.where(frozen, torch.sigmoid(z), torch.sigmoid(tau * (r_live - 1)))
    return -(4.0 / tau) * gate * adv


def policy_rows_torch(logp, advantages, mask, old, ref, weight, entropy, params: PolicyLossParams):
    """`[B, T]` inputs (advantages `[B]` or `[B, T]`; optional ones None) → (row_loss `[B]`, stats `[B, K]`).

    Computes in float32 (float64 when logp is float64). old/ref/weight/advantages are constants;
    `weight` is the detached per-token factor of the policy term (importance weights, masks).
    """
    dt = torch.float64 if logp.dtype == torch.float64 else torch.float32
    m = mask if mask.dtype == torch.bool else mask != 0
    mf = m.to(dt)
    lp = torch.where(m, logp.to(dt), 0.0)
    adv = advantages.detach().to(dt)
    adv = torch.where(m, adv if adv.dim() == 2 else adv.unsqueeze(-1), 0.0)
    old_c = lp.detach() if old is None else torch.where(m, old.detach().to(dt), 0.0)
    log_r = _log_ratio(lp, old_c, m, mf, params.ratio_level)
    r = torch.exp(log_r.detach())
    zero = torch.zeros_like(mf)
    dual = torch.zeros_like(m)
    if params.pg == "clip":
        pg, dual = _clip_pg(r, log_r, adv, m, params)
    elif params.pg == "sapo":
        pg = _sapo_pg(r, log_r, adv, m, params)
    else:
        pg = -adv * lp
    w = torch.ones_like(mf) if weight is None else torch.where(m, weight.detach().to(dt), 0.0)
    loss = w * pg
    kl = zero
    if ref is not None:
        kl = kl_term(torch.where(m, ref.detach().to(dt), 0.0) - lp, params.kl, params.kl_clip)
        if params.beta != 0:
            # TRL's bias-corrected KL: KL × r with the gradient of r
            kl_used = kl * torch.exp(torch.where(m, log_r, 0.0)) if params.kl_bias_correction else kl
            loss = loss + params.beta * kl_used
    h = zero
    if entropy is not None:
        h = torch.where(m, entropy.to(dt), 0.0)
        if params.entropy_coef != 0:
            loss = loss - params.entropy_coef * h
    row_loss = (loss * mf).sum(-1)
    with torch.no_grad():
        clipping = params.pg == "clip"
        lo, hi = 1.0 - params.eps_low, 1.0 + params.eps_high
        cols = dict(
            tokens=mf,
            clip_low=(m & (r < lo) & (adv < 0)).to(dt) if clipping else zero,
            clip_high=(m & (r > hi) & (adv > 0)).to(dt) if clipping else zero,
            clip_dual=dual.to(dt),
            ratio=r * mf,
            log_ratio_abs=log_r.detach().abs() * mf,
            kl=kl.detach() * mf,
            entropy=h.detach() * mf,
            is_weight=w * mf,
        )
        stats = torch.stack([cols[name].sum(-1) for name in STATS], dim=-1).float()
    return row_loss.float() if dt == torch.float32 else row_loss, stats
