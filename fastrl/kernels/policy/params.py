"""The per-token policy loss's frozen parameters and the layout of its per-sequence statistics.

`STATS` names the columns of the `[B, K]` stats both implementations return; `STAT_CONSTEXPRS` gives the
Triton kernel each column's index under the constexpr name it stores by (`STAT_TOKENS`, ...), so the
two paths cannot disagree on which column holds what.
"""

from dataclasses import dataclass

__all__ = ["KL_CODES", "NUM_STATS", "STATS", "STAT_CONSTEXPRS", "PolicyLossParams"]

# Per-sequence masked sums: token count, clip-low / clip-high / dual-clip hits, ratio, |log ratio|,
# KL estimate, entropy and IS weight (docs/math.md §2).
STATS = ("tokens", "clip_low", "clip_high", "clip_dual", "ratio", "log_ratio_abs", "kl", "entropy", "is_weight")
NUM_STATS = len(STATS)
STAT_CONSTEXPRS = {f"STAT_{name.upper()}": i for i, name in enumerate(STATS)}
# The kernel's constexpr code for each KL estimator.
KL_CODES = {"k1": 1, "k2": 2, "k3": 3}


@dataclass(frozen=True)
class PolicyLossParams:
    """No defaults here: the loss's configuration declares them, and one function maps it to this."""

    eps_low: float  # lower clip bound is 1 − eps_low
    eps_high: float  # upper clip bound is 1 + eps_high
    dual_clip: float | None  # c > 1 caps the A < 0 loss at −c·A; None = off
    beta: float  # KL coefficient (the KL is still computed for the metric when ref is given)
    kl: str  # estimator of KL(π‖π_ref) per token, a key of KL_CODES
    entropy_coef: float  # α of the −α·H bonus
    is_cap: float | None  # truncation C of the rollout importance weight; None = no IS weight
    seq_ratio: bool  # GSPO: one ratio per sequence, exp of the masked mean log ratio

    def __post_init__(self):
        if self.kl not in KL_CODES:
            raise ValueError(f"kl must be one of {tuple(KL_CODES)}, got {self.kl!r}")
