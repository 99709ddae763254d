"""An independent float64 implementation of docs/math.md §2–3, one token at a time: the tests' ground truth.

Written from the text of docs/math.md only (no code shared with fastrl): plain Python control flow over 0-dim
float64 tensors, so autograd gives the reference gradients.
"""

import math

import torch


def _v(x):
    return float(x.detach())


def _c(x):
    return torch.tensor(float(x), dtype=torch.float64)


def _kl(rho, kind, clip):
    base = kind.rstrip("+")
    if base == "k1":
        kl = -rho
    elif base == "k2":
        kl = rho * rho / 2
    elif base == "abs":
        kl = rho if _v(rho) >= 0 else -rho
    else:
        kl = torch.exp(rho) - rho - 1
    if clip is not None and abs(_v(kl)) > clip:
        kl = _c(math.copysign(clip, _v(kl)))
    if kind.endswith("+"):  # the estimate's value, the gradient of ρ²/2
        kl = rho * rho / 2 - _v(rho * rho / 2) + _v(kl)
    return kl


def _quantile(values, q):
    """Linear interpolation between order statistics (numpy's default)."""
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _is_weights(cfg, old_at, rollout, i, toks):
    """token → IS weight of docs/math.md §2 (a plain float)."""
    diffs = {t: old_at(t) - float(rollout[i, t]) for t in toks}
    if cfg.is_level == "sequence":
        total = sum(diffs.values())
        diffs = {t: total for t in toks}
    out = {}
    for t, d in diffs.items():
        if cfg.is_log_clip is not None:
            d = max(-cfg.is_log_clip, min(cfg.is_log_clip, d))
        w = math.exp(d)
        lo = cfg.is_min
        if cfg.is_mode == "truncate":
            w = min(w, cfg.is_cap) if lo is None else max(lo, min(w, cfg.is_cap))
        elif w > cfg.is_cap or (lo is not None and w < lo):
            w = 0.0
        out[t] = w
    return out


def oracle_loss(
    logp, adv, mask, cfg, *, old=None, ref=None, rollout=None, entropy=None, normalizer=None, accumulation_steps=1
):
    """float64 loss of docs/math.md §2–3. logp/entropy may require grad; cfg is a LossConfig."""
    B, T = logp.shape
    live = [(i, t) for i in range(B) for t in range(T) if bool(mask[i, t])]
    h_keep = None
    if cfg.top_entropy_quantile < 1:
        values = [float(entropy[i, t]) for i, t in live]
        thr = _quantile(values, 1 - cfg.top_entropy_quantile) if values else math.inf
        h_keep = {(i, t) for i, t in live if float(entropy[i, t]) >= thr}
    rows, counts = [], []
    for i in range(B):
        toks = [t for t in range(T) if bool(mask[i, t])]
        n = len(toks)

        def old_at(t):
            return _v(logp[i, t]) if old is None else float(old[i, t])

        def a_at(t):
            return float(adv[i] if adv.dim() == 1 else adv[i, t])

        seq_log_r = sum((logp[i, t] - old_at(t) for t in toks), _c(0)) / max(n, 1)
        w_is = _is_weights(cfg, old_at, rollout, i, toks) if cfg.is_cap is not None else {}
        keep_row = 1.0
        if cfg.off_policy_mask is not None:
            sampling = [old_at(t) if rollout is None else float(rollout[i, t]) for t in toks]
            mean_kl = sum(s - _v(logp[i, t]) for s, t in zip(sampling, toks)) / max(n, 1)
            keep_row = mean_kl <= cfg.off_policy_mask
        phi = None
        if cfg.pg_loss == "vespo":
            log_w = sum(max(-20.0, min(20.0, _v(logp[i, t]) - old_at(t))) for t in toks)
            if cfg.is_cap is not None:  # every position's IS weight, a masked one's from a zero log ratio
                at_zero = _is_weights(cfg, lambda _: 0.0, torch.zeros(B, T), i, [0])[0]
                for t in range(T):
                    w = w_is.get(t, at_zero)
                    log_w += max(math.log(1e-8), min(20.0, math.log(w) if w > 0 else -math.inf))
            log_w = max(math.log(1e-8), min(20.0, log_w))
        total = _c(0)
        for t in toks:
            a = a_at(t)
            if cfg.ratio_level == "token":
                log_r = logp[i, t] - old_at(t)
            elif cfg.ratio_level == "sequence":
                log_r = seq_log_r
            else:  # the sequence ratio's value, the token's own gradient
                log_r = logp[i, t] - _v(logp[i, t]) + _v(seq_log_r)
            r = torch.exp(log_r)
            lo, hi = 1 - cfg.eps_low, 1 + cfg.eps_high
            if cfg.pg_loss == "clip":
                clipped = _c(lo) if _v(r) < lo else _c(hi) if _v(r) > hi else r
                unclipped_obj, clipped_obj = r * a, clipped * a
                pg = -(unclipped_obj if _v(unclipped_obj) <= _v(clipped_obj) else clipped_obj)
                if cfg.dual_clip is not None and a < 0 and _v(pg) > -cfg.dual_clip * a:
                    pg = _c(-cfg.dual_clip * a)
            elif cfg.pg_loss == "sapo":
                tau = cfg.sapo_tau_pos if a > 0 else cfg.sapo_tau_neg
                pg = -(4 / tau) * torch.sigmoid(tau * (r - 1)) * a
            elif cfg.pg_loss == "cispo":
                pg = -min(max(_v(r), lo), hi) * a * logp[i, t]
            elif cfg.pg_loss == "gpg":
                pg = -a * logp[i, t]
            else:
                k = cfg.vespo_k_pos if a >= 0 else cfg.vespo_k_neg
                lam = max(cfg.vespo_lambda_pos if a >= 0 else cfg.vespo_lambda_neg, 1e-4)
                phi = math.exp(lam + k * log_w - lam * math.exp(log_w))
                pg = -phi * a * logp[i, t]
            if cfg.is_cap is not None and cfg.pg_loss != "vespo":
                pg = w_is[t] * pg
            if cfg.off_policy_mask is not None and not (a >= 0 or keep_row):
                pg = pg * 0
            if h_keep is not None and (i, t) not in h_keep:
                pg = pg * 0
            ell = pg
            if cfg.beta:
                kl = _kl(ref[i, t] - logp[i, t], cfg.kl, cfg.kl_clip)
                ell = ell + cfg.beta * (kl * r if cfg.kl_bias_correction else kl)
            if cfg.entropy_coef and cfg.entropy_agg == "loss":
                ell = ell - cfg.entropy_coef * entropy[i, t]
            total = total + ell
        rows.append(total)
        counts.append(n)
    n_rows = B if cfg.count_empty_rows else sum(1 for c in counts if c)
    if cfg.loss_agg == "token-mean":
        num, default = sum(rows), sum(counts)
    elif cfg.loss_agg == "token-sum":
        num, default = sum(rows), 1
    elif cfg.loss_agg == "seq-mean-token-mean":
        num, default = sum(r / max(c, 1) for r, c in zip(rows, counts)), n_rows
    elif cfg.loss_agg == "seq-mean-token-sum":
        num, default = sum(rows), n_rows
    else:
        num, default = sum(rows) / cfg.max_completion_length, n_rows
    norm = default if normalizer is None else normalizer
    loss = num / (norm if norm > 0 else 1)
    if cfg.entropy_coef and cfg.entropy_agg == "token-mean":
        kept = [(i, t) for i, t in live if h_keep is None or (i, t) in h_keep]
        h = sum((entropy[i, t] for i, t in kept), _c(0)) / max(len(kept), 1)
        loss = loss - cfg.entropy_coef * h / accumulation_steps
    return loss


def oracle_logprobs(hidden, weight, targets, bias, temperature, entropy=False):
    """float64 log-softmax gather (and entropy) through the full logits; -100 targets give 0."""
    z = hidden.double() @ weight.double().T
    if bias is not None:
        z = z + bias.double()
    logq = torch.log_softmax(z / temperature, dim=-1)
    valid = targets != -100
    lp = logq.gather(-1, torch.where(valid, targets, 0).unsqueeze(-1)).squeeze(-1) * valid
    if not entropy:
        return lp, None
    return lp, -(logq.exp() * logq).sum(-1) * valid
