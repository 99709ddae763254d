"""The per-token policy loss's frozen parameters and the layout of its per-sequence statistics.

`STATS` names the columns of the `[B, K]` stats both implementations return; `STAT_CONSTEXPRS` gives the
Triton kernel each column's index under the constexpr name it stores by (`STAT_TOKENS`, ...), so the
two paths cannot disagree on which column holds what.
"""

from dataclasses import dataclass

__all__ = [
    "KL_CODES",
    "NUM_STATS",
    "PG_CODES",
    "RATIO_LEVELS",
    "SAPO_SATURATED",
    "STATS",
    "STAT_CONSTEXPRS",
    "PolicyLossParams",
]

# Per-sequence masked sums: token count, clip-low / clip-high / dual-clip hits, ratio, |log ratio|,
# KL estimate, entropy and the policy term's weight (docs/math.md §2).
STATS = ("tokens", "clip_low", "clip_high", "clip_dual", "ratio", "log_ratio_abs", "kl", "entropy", "is_weight")
NUM_STATS = len(STATS)
STAT_CONSTEXPRS = {f"STAT_{name.upper()}": i for i, name in enumerate(STATS)}
# The kernel's constexpr code for each KL estimator; a "+" is the estimate's value with the gradient of ρ²/2.
KL_CODES = {"k1": 1, "k2": 2, "k3": 3, "abs": 4, "k1+": 5, "k3+": 6}
# The policy term: PPO's clipped ratio, SAPO's soft gate, or −A·logp (times the weight: CISPO, GPG, VESPO).
PG_CODES = {"clip": 0, "sapo": 1, "linear": 2}
RATIO_LEVELS = ("token", "sequence", "sequence-token")
# SAPO's gate σ(τ(r − 1)) is 1 to float64 rounding beyond this argument: there it is a constant (no 0·inf).
SAPO_SATURATED = 50.0


@dataclass(frozen=True)
class PolicyLossParams:
    """No defaults here: the loss's configuration declares them, and one function maps it to this."""

    eps_low: float  # lower clip bound is 1 − eps_low
    eps_high: float  # upper clip bound is 1 + eps_high
    dual_clip: float | None  # c > 1 caps the A < 0 loss at −c·A; None = off
    beta: float  # KL coefficient (the KL is still computed for the metric when ref is given)
    kl: str  # estimator of KL(π‖π_ref) per token, a key of KL_CODES
    kl_clip: float | None  # the KL estimate clamped to [−kl_clip, kl_clip]; None = off
    kl_bias_correction: bool  # the KL term times the (differentiable) ratio r
    entropy_coef: float  # α of the −α·H bonus
    pg: str  # the policy term, a key of PG_CODES
    sapo_tau_pos: float  # SAPO gate temperature for A > 0
    sapo_tau_neg: float  # and for A ≤ 0
    ratio_level: str  # "token"; "sequence" (GSPO: exp of the masked mean log ratio); "sequence-token"
    # (GSPO-token: the sequence ratio's value, each token's own gradient)

    def __post_init__(self):
        if self.kl not in KL_CODES:
            raise ValueError(f"kl must be one of {tuple(KL_CODES)}, got {self.kl!r}")
        if self.pg not in PG_CODES:
            raise ValueError(f"pg must be one of {tuple(PG_CODES)}, got {self.pg!r}")
        if self.ratio_level not in RATIO_LEVELS:
            raise ValueError(f"ratio_level must be one of {RATIO_LEVELS}, got {self.ratio_level!r}")
