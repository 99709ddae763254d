"""The detached per-token factor of the policy term (docs/math.md §2): importance weights and masks.

All of it is computed from constants (old / rollout log-probs, detached current log-probs, advantages,
entropies) on `[B, T]` tensors before the fused kernel runs; the kernel multiplies the policy term by it.
"""

import math

import torch

from .config import LossConfig

__all__ = ["entropy_mask", "is_weight", "policy_weight", "vespo_weight"]

VESPO_LOG_MIN = math.log(1e-8)  # VESPO's log-weight floor
VESPO_LOG_MAX = 20.0


def is_weight(base: torch.Tensor, rollout: torch.Tensor, m: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """Rollout IS weight from log(π_old / π_rollout): per token or one per sequence, truncated or masked."""
    diff = torch.nan_to_num(torch.where(m, base - rollout, 0.0), nan=0.0)  # an unscored token: weight 1
    if cfg.is_level == "sequence":
        diff = diff.sum(-1, keepdim=True)
    if cfg.is_log_clip is not None:
        diff = diff.clamp(-cfg.is_log_clip, cfg.is_log_clip)
    w = torch.exp(diff)
    if cfg.is_mode == "truncate":
        w = w.clamp(min=cfg.is_min, max=cfg.is_cap)
    else:
        lo = -math.inf if cfg.is_min is None else cfg.is_min
        w = torch.where((w < lo) | (w > cfg.is_cap), 0.0, w)
    return w.expand_as(base)


def _ratio(logp_det, old, m, cfg: LossConfig) -> torch.Tensor:
    log_r = torch.where(m, logp_det - old, 0.0)
    if cfg.ratio_level != "token":
        n = m.sum(-1, keepdim=True).clamp(min=1)
        log_r = (log_r.sum(-1, keepdim=True) / n).expand_as(log_r)
    return torch.exp(log_r)


def vespo_weight(logp_det, old, m, adv, w_is, cfg: LossConfig) -> torch.Tensor:
    """VESPO's gamma weight φ(w) of the sequence ratio w (times the token IS weights), normalised φ(1) = 1."""
    log_w = torch.where(m, (logp_det - old).clamp(-20.0, 20.0), 0.0).sum(-1, keepdim=True)
    if w_is is not None:
        # all positions, as TRL sums them (a masked one holds the weight of a zero log ratio)
        log_is = torch.log(w_is).clamp(VESPO_LOG_MIN, VESPO_LOG_MAX)
        log_w = log_w + log_is.sum(-1, keepdim=True)
    log_w = log_w.clamp(VESPO_LOG_MIN, VESPO_LOG_MAX)
    pos = adv >= 0
    k = torch.where(pos, adv.new_tensor(cfg.vespo_k_pos), adv.new_tensor(cfg.vespo_k_neg))
    lam = torch.where(pos, adv.new_tensor(cfg.vespo_lambda_pos), adv.new_tensor(cfg.vespo_lambda_neg)).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    return torch.nan_to_num(phi, nan=0.0, posinf=0.0, neginf=0.0)


def entropy_mask(entropy: torch.Tensor, m: torch.Tensor, quantile: float) -> torch.Tensor:
    """Tokens whose entropy is at or above the (1 − quantile) quantile of this call's masked entropies."""
    live = entropy.detach()[m]
    if live.numel() == 0:
        return torch.zeros_like(m)
    threshold = torch.quantile(live.float(), 1 - quantile)
    return (torch.where(m, entropy.detach(), 0.0) >= threshold) & m


def policy_weight(cfg: LossConfig, logp, old, rollout, m, adv, entropy):
    """→ (weight `[B, T]` or None, entropy mask or None, metrics). adv is `[B, 1]` or `[B, T]`."""
    dt = torch.float64 if logp.dtype == torch.float64 else torch.float32
    logp_det = torch.where(m, logp.detach().to(dt), 0.0)
    old_c = logp_det if old is None else torch.where(m, old.detach().to(dt), 0.0)
    adv = adv.detach().to(dt)
    factors, metrics = [], {}
    count = m.sum().clamp(min=1)
    w_is = None
    if cfg.is_cap is not None:
        w_is = is_weight(old_c, torch.where(m, rollout.detach().to(dt), 0.0), m, cfg)
        metrics["is_weight_mean"] = (w_is * m).sum() / count
        if cfg.pg_loss != "vespo":  # VESPO folds the IS weights into φ
            factors.append(w_is)
    if cfg.pg_loss == "cispo":
        r = _ratio(logp_det, old_c, m, cfg)
        lo, hi = 1 - cfg.eps_low, 1 + cfg.eps_high
        factors.append(r.clamp(lo, hi))
        metrics["clip_frac_low"] = ((r < lo) & m).sum() / count
        metrics["clip_frac_high"] = ((r > hi) & m).sum() / count
    elif cfg.pg_loss == "vespo":
        phi = vespo_weight(logp_det, old_c, m, adv, w_is, cfg)
        factors.append(phi)
        metrics["vespo_phi_mean"] = (phi * m).sum() / count
    if cfg.off_policy_mask is not None:
        sampling = old_c if rollout is None else torch.where(m, rollout.detach().to(dt), 0.0)
        kl = torch.nan_to_num(sampling - logp_det, nan=0.0) * m
        mean_kl = kl.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)
        keep = ((adv >= 0) | (mean_kl <= cfg.off_policy_mask)).to(dt)
        factors.append(keep)
        metrics["off_policy_masked_frac"] = ((1 - keep) * m).sum() / count
    h_mask = None
    if cfg.top_entropy_quantile < 1:
        h_mask = entropy_mask(entropy, m, cfg.top_entropy_quantile)
        factors.append(h_mask.to(dt))
    if not factors:
        return None, h_mask, metrics
    weight = torch.ones_like(logp_det)
    for f in factors:
        weight = weight * f
    return torch.where(m, weight, 0.0), h_mask, {k: v.float() for k, v in metrics.items()}
