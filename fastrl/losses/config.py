"""`LossConfig`: every knob of the PPO/GRPO policy loss (docs/math.md §2–3), validated once on construction."""

import numbers
from dataclasses import dataclass

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
# TRL's `loss_type` names. "dapo" is token-mean whose normalizer is the GLOBAL token count of the
# optimizer step: pass it as `normalizer=` (the default, the micro-batch count, is TRL's "bnpo").
TRL_ALIASES = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dapo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
}
KL_ESTIMATORS = ("k1", "k2", "k3")
RATIO_LEVELS = ("token", "sequence")

__all__ = ["AGG_MODES", "KL_ESTIMATORS", "RATIO_LEVELS", "TRL_ALIASES", "LossConfig"]


def _number(name: str, value, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        kind = "a float or None" if allow_none else "a float"
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__} {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {value}")


@dataclass(frozen=True)
class LossConfig:
    """Policy-loss settings. `loss_agg` is stored under its docs/math.md §3 name (a TRL alias is translated).

    Raises:
        ValueError / TypeError naming the bad field and value.
    """

    loss_agg: str = "token-mean"  # docs/math.md §3 mode, or a TRL alias: grpo / bnpo / dapo / dr_grpo
    eps_low: float = 0.2  # ratio clipped below at 1 − eps_low
    eps_high: float = 0.2  # ratio clipped above at 1 + eps_high (DAPO's clip-higher: 0.28)
    dual_clip: float | None = None  # c > 1: caps the loss of A < 0 tokens at −c·A; None = off
    beta: float = 0.0  # KL-to-reference coefficient; > 0 needs ref_logprobs
    kl: str = "k3"  # KL estimator: k1 = −ρ, k2 = ρ²/2, k3 = exp(ρ) − ρ − 1 with ρ = ref − logp
    entropy_coef: float = 0.0  # α in ℓ = pg + β·kl − α·H; ≠ 0 needs the entropy
    temperature: float = 1.0  # sampling temperature; grpo_loss divides the logits by it
    ratio_level: str = "token"  # "token" (PPO/GRPO) or "sequence" (GSPO: exp of the masked mean log ratio)
    max_completion_length: int | None = None  # L_max of seq-mean-token-sum-norm (dr_grpo)
    is_cap: float | None = None  # C of the rollout IS weight min(exp(old − rollout), C); needs rollout_logprobs

    def __post_init__(self):
        if not isinstance(self.loss_agg, str):
            raise TypeError(f"loss_agg must be a str, got {type(self.loss_agg).__name__} {self.loss_agg!r}")
        given = self.loss_agg
        agg = TRL_ALIASES.get(given, given)
        if agg not in AGG_MODES:
            raise ValueError(f"loss_agg must be one of {AGG_MODES} or {tuple(TRL_ALIASES)}, got {given!r}")
        object.__setattr__(self, "loss_agg", agg)
        for name in ("eps_low", "eps_high", "beta", "entropy_coef", "temperature"):
            _number(name, getattr(self, name))
        for name in ("eps_low", "eps_high", "beta"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.eps_low >= 1:
            raise ValueError(
                f"eps_low must be < 1 (the lower clip bound 1 - eps_low must stay > 0), got {self.eps_low}"
            )
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        _number("dual_clip", self.dual_clip, allow_none=True)
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"dual_clip must be None or > 1, got {self.dual_clip}")
        _number("is_cap", self.is_cap, allow_none=True)
        if self.is_cap is not None and not self.is_cap > 0:
            raise ValueError(f"is_cap must be None or > 0, got {self.is_cap}")
        if self.kl not in KL_ESTIMATORS:
            raise ValueError(f"kl must be one of {KL_ESTIMATORS}, got {self.kl!r}")
        if self.ratio_level not in RATIO_LEVELS:
            raise ValueError(f"ratio_level must be one of {RATIO_LEVELS}, got {self.ratio_level!r}")
        length = self.max_completion_length
        if length is not None and (isinstance(length, bool) or not isinstance(length, numbers.Integral) or length <= 0):
            raise ValueError(f"max_completion_length must be None or a positive int, got {length!r}")
        if length is not None:
            object.__setattr__(self, "max_completion_length", int(length))
        if agg == "seq-mean-token-sum-norm" and length is None:
            raise ValueError(f"loss_agg={given!r} divides by the max completion length: set max_completion_length")
