"""An independent float64 implementation of docs/math.md §2–3, one token at a time: the tests' ground truth.

Written from the text of docs/math.md only (no code shared with fastrl): plain Python control flow over 0-dim
float64 tensors, so autograd gives the reference gradients.
"""

import math

import torch


def _v(x):
    return float(x.detach())


def _kl(rho, kind):
    if kind == "k1":
        return -rho
    if kind == "k2":
        return rho * rho / 2
    return torch.exp(rho) - rho - 1


def oracle_loss(logp, adv, mask, cfg, *, old=None, ref=None, rollout=None, entropy=None, normalizer=None):
    """float64 loss of docs/math.md §2–3. logp/entropy may require grad; cfg is a LossConfig."""
    B, T = logp.shape
    rows, counts = [], []
    for i in range(B):
        toks = [t for t in range(T) if bool(mask[i, t])]
        n = len(toks)

        def old_at(t):
            return logp[i, t].detach() if old is None else old[i, t]

        seq_log_r = None
        if cfg.ratio_level == "sequence":
            seq_log_r = sum((logp[i, t] - old_at(t) for t in toks), torch.zeros((), dtype=torch.float64))
            seq_log_r = seq_log_r / max(n, 1)
        total = torch.zeros((), dtype=torch.float64)
        for t in toks:
            a = float(adv[i] if adv.dim() == 1 else adv[i, t])
            log_r = seq_log_r if seq_log_r is not None else logp[i, t] - old_at(t)
            r = torch.exp(log_r)
            if _v(r) < 1 - cfg.eps_low:
                clipped = torch.tensor(1 - cfg.eps_low, dtype=torch.float64)
            elif _v(r) > 1 + cfg.eps_high:
                clipped = torch.tensor(1 + cfg.eps_high, dtype=torch.float64)
            else:
                clipped = r
            unclipped_obj, clipped_obj = r * a, clipped * a
            pg = -(unclipped_obj if _v(unclipped_obj) <= _v(clipped_obj) else clipped_obj)
            if cfg.dual_clip is not None and a < 0 and _v(pg) > -cfg.dual_clip * a:
                pg = torch.tensor(-cfg.dual_clip * a, dtype=torch.float64)
            if rollout is not None:
                w = min(math.exp(_v(old_at(t)) - _v(rollout[i, t])), cfg.is_cap)
                pg = w * pg
            ell = pg
            if cfg.beta:
                ell = ell + cfg.beta * _kl(ref[i, t] - logp[i, t], cfg.kl)
            if cfg.entropy_coef:
                ell = ell - cfg.entropy_coef * entropy[i, t]
            total = total + ell
        rows.append(total)
        counts.append(n)
    if cfg.loss_agg == "token-mean":
        num, default = sum(rows), sum(counts)
    elif cfg.loss_agg == "seq-mean-token-mean":
        num, default = sum(r / max(c, 1) for r, c in zip(rows, counts)), B
    elif cfg.loss_agg == "seq-mean-token-sum":
        num, default = sum(rows), B
    else:
        num, default = sum(rows) / cfg.max_completion_length, B
    norm = default if normalizer is None else normalizer
    return num / (norm if norm > 0 else 1)


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
