"""`LossConfig`: every knob of the PPO/GRPO policy loss (docs/math.md §2–3), validated once on construction."""

import numbers
from dataclasses import dataclass

from fastrl.kernels import SamplerSettings

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum")
# TRL's `loss_type` names. "dapo" is token-mean whose normalizer is the GLOBAL token count of the
# optimizer step: pass it as `normalizer=` (the default, the micro-batch count, is TRL's "bnpo").
TRL_ALIASES = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dapo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
}
PG_LOSSES = ("clip", "cispo", "sapo", "gpg", "vespo")
KL_ESTIMATORS = ("k1", "k2", "k3", "abs", "k1+", "k3+")
RATIO_LEVELS = ("token", "sequence", "sequence-token")
IS_LEVELS = ("token", "sequence")
IS_MODES = ("truncate", "mask")
ENTROPY_AGGS = ("loss", "token-mean")
# verl's rejection-sampling options: where (token, or the sequence's sum / mean / max) and which divergence of
# log(π_old / π_rollout); a k1 option keeps ratios in [lower, upper], the others divergences ≤ upper
REJECTION_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
                     "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")  # fmt: skip

_SAMPLER_FIELDS = ("temperature", "top_k", "top_p", "min_p", "softcap")

__all__ = ["AGG_MODES", "KL_ESTIMATORS", "PG_LOSSES", "RATIO_LEVELS", "REJECTION_OPTIONS", "TRL_ALIASES", "LossConfig"]


def _number(name: str, value, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        kind = "a float or None" if allow_none else "a float"
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__} {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {value}")


def _choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


@dataclass(frozen=True)
class LossConfig:
    """Policy-loss settings. `loss_agg` is stored under its docs/math.md §3 name (a TRL alias is translated).

    `fastrl.integrations.loss_config_from_trl(grpo_config)` and `loss_config_from_verl(actor_config)` build the
    config that reproduces those trainers' loss.

    Raises:
        ValueError / TypeError naming the bad field and value.
    """

    loss_agg: str = "token-mean"  # docs/math.md §3 mode, or a TRL alias: grpo / bnpo / dapo / dr_grpo
    eps_low: float = 0.2  # ratio clipped below at 1 − eps_low
    eps_high: float = 0.2  # ratio clipped above at 1 + eps_high (DAPO's clip-higher: 0.28)
    dual_clip: float | None = None  # c > 1: caps the loss of A < 0 tokens at −c·A; None = off
    beta: float = 0.0  # KL-to-reference coefficient; > 0 needs ref_logprobs
    kl: str = "k3"  # k1 = −ρ, k2 = ρ²/2, k3 = exp(ρ) − ρ − 1, abs = |ρ| (ρ = ref − logp); "+": k2's gradient
    entropy_coef: float = 0.0  # α in ℓ = pg + β·kl − α·H; ≠ 0 needs the entropy
    temperature: float = 1.0  # sampling temperature; grpo_loss divides the logits by it (see `sampler`)
    ratio_level: str = "token"  # "token", "sequence" (GSPO) or "sequence-token" (GSPO-token)
    max_completion_length: int | None = None  # L_max of seq-mean-token-sum-norm (dr_grpo)
    is_cap: float | None = None  # upper bound C of the rollout IS weight; needs rollout_logprobs
    # --- added terms (docs/math.md §2) ---
    pg_loss: str = "clip"  # "clip" (PPO), "cispo", "sapo", "gpg" (−A·logp), "vespo"
    kl_bias_correction: bool = False  # KL term × the differentiable ratio r (TRL's use_bias_correction_kl)
    kl_clip: float | None = None  # the KL estimate clamped to [−kl_clip, kl_clip] (verl's low_var_kl: 10)
    is_level: str = "token"  # IS weight per token, or one per sequence from Σ_t (old − rollout)
    is_mode: str = "truncate"  # "truncate": clamp to [is_min, is_cap]; "mask": 0 outside [is_min, is_cap]
    is_min: float | None = None  # lower bound of the IS weight (None: none)
    is_log_clip: float | None = None  # the IS log ratio clamped to ±is_log_clip first (verl: 20)
    off_policy_mask: float | None = None  # drop A < 0 sequences whose mean (rollout − logp) > this (OPSM)
    top_entropy_quantile: float = 1.0  # policy term only on tokens at or above this entropy quantile
    entropy_agg: str = "loss"  # entropy bonus aggregated as the loss ("loss") or a token mean ("token-mean")
    count_empty_rows: bool = True  # seq-mean-*: default normalizer B (True) or the non-empty rows (False)
    sapo_tau_pos: float = 1.0  # SAPO gate temperature for A > 0
    sapo_tau_neg: float = 1.05  # and for A ≤ 0
    vespo_k_pos: float = 2.0  # VESPO gamma weight φ(w) = exp(λ + k·log w − λ·w), for A ≥ 0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0  # and for A < 0
    vespo_lambda_neg: float = 2.0
    rejection: tuple = ()  # ((option, lower, upper), ...) of REJECTION_OPTIONS: tokens / sequences masked out
    # --- the sampler's distribution (docs/math.md §8), checked and stored as `SamplerSettings` stores them ---
    top_k: int | None = None  # keep the k most likely tokens (None = off; 0 and -1 are read as None)
    top_p: float | None = None  # nucleus: keep tokens whose higher-ranked mass is < top_p (None = off; 1.0 too)
    min_p: float | None = None  # drop tokens below min_p × the most likely one's probability (None = off; 0.0 too)
    softcap: float | None = None  # the model's final-logit soft-cap cap·tanh(x / cap), before the temperature

    @property
    def sampler(self) -> SamplerSettings:
        """The sampler's settings (temperature, top-k, top-p, min-p, soft-cap) as one object, checked once."""
        return self._sampler

    @property
    def sampler_on(self) -> bool:
        """Whether the log-probs are those of a truncated or soft-capped distribution (docs/math.md §8)."""
        return self.sampler.on

    def __post_init__(self):
        if not isinstance(self.loss_agg, str):
            raise TypeError(f"loss_agg must be a str, got {type(self.loss_agg).__name__} {self.loss_agg!r}")
        given = self.loss_agg
        agg = TRL_ALIASES.get(given, given)
        if agg not in AGG_MODES:
            raise ValueError(f"loss_agg must be one of {AGG_MODES} or {tuple(TRL_ALIASES)}, got {given!r}")
        object.__setattr__(self, "loss_agg", agg)
        floats = ("eps_low", "eps_high", "beta", "entropy_coef", "top_entropy_quantile")
        floats += ("sapo_tau_pos", "sapo_tau_neg", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg")
        for name in floats + ("vespo_lambda_neg",):
            _number(name, getattr(self, name))
        for name in ("is_cap", "dual_clip", "kl_clip", "is_min", "is_log_clip", "off_policy_mask"):
            _number(name, getattr(self, name), allow_none=True)
        _choice("pg_loss", self.pg_loss, PG_LOSSES)
        _choice("kl", self.kl, KL_ESTIMATORS)
        _choice("ratio_level", self.ratio_level, RATIO_LEVELS)
        _choice("is_level", self.is_level, IS_LEVELS)
        _choice("is_mode", self.is_mode, IS_MODES)
        _choice("entropy_agg", self.entropy_agg, ENTROPY_AGGS)
        for name in ("kl_bias_correction", "count_empty_rows"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        self._check_ranges(given, agg)
        self._check_rejection()
        self._check_sampler()

    def _check_sampler(self) -> None:
        # SamplerSettings checks the five and normalises "off" to None; the fields keep its values, and `sampler`
        # hands out this one object (no field: equality and replace() read the five fields)
        settings = SamplerSettings(**{n: getattr(self, n) for n in _SAMPLER_FIELDS})
        for name, value in settings.as_dict().items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_sampler", settings)

    def _check_rejection(self) -> None:
        if isinstance(self.rejection, (str, bytes)) or not isinstance(self.rejection, (tuple, list)):
            raise TypeError(f"rejection must be a tuple of (option, lower, upper), got {self.rejection!r}")
        rules = []
        for rule in self.rejection:
            if not isinstance(rule, (tuple, list)) or len(rule) != 3:
                raise ValueError(f"a rejection rule must be (option, lower, upper), got {rule!r}")
            option, lower, upper = rule
            _choice("rejection option", option, REJECTION_OPTIONS)
            _number(f"{option} upper", upper)
            _number(f"{option} lower", lower, allow_none=True)
            if option.endswith("k1"):
                if lower is None or not 0 < lower <= upper:
                    raise ValueError(f"{option} keeps ratios in [lower, upper]: needs 0 < lower <= upper, got {rule}")
            elif lower is not None or not upper > 0:
                raise ValueError(f"{option} bounds a divergence: needs lower None and upper > 0, got {rule}")
            rules.append((option, None if lower is None else float(lower), float(upper)))
        object.__setattr__(self, "rejection", tuple(rules))

    def _check_ranges(self, given: str, agg: str) -> None:
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if self.pg_loss == "cispo":
            # CISPO clamps the (detached) weight to [1 − eps_low, 1 + eps_high]; eps_low = 1: no lower bound
            if not (self.eps_low <= 1 and self.eps_high > -1 and 1 - self.eps_low <= 1 + self.eps_high):
                raise ValueError(
                    f"pg_loss='cispo' needs 0 <= 1 - eps_low <= 1 + eps_high, got eps_low={self.eps_low}, "
                    f"eps_high={self.eps_high}"
                )
        else:
            for name in ("eps_low", "eps_high"):
                if getattr(self, name) < 0:
                    raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
            if self.eps_low >= 1:
                raise ValueError(
                    f"eps_low must be < 1 (the lower clip bound 1 - eps_low must stay > 0), got {self.eps_low}"
                )
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"dual_clip must be None or > 1, got {self.dual_clip}")
        for name in ("is_cap", "kl_clip", "is_log_clip", "sapo_tau_pos", "sapo_tau_neg"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be None or > 0, got {value}")
        if self.is_min is not None:
            if self.is_cap is None:
                raise ValueError(f"is_min={self.is_min} needs is_cap (the IS weight is on only with is_cap)")
            if not 0 <= self.is_min <= self.is_cap:
                raise ValueError(f"is_min must be in [0, is_cap={self.is_cap}], got {self.is_min}")
        if not 0 < self.top_entropy_quantile <= 1:
            raise ValueError(f"top_entropy_quantile must be in (0, 1], got {self.top_entropy_quantile}")
        length = self.max_completion_length
        if length is not None and (isinstance(length, bool) or not isinstance(length, numbers.Integral) or length <= 0):
            raise ValueError(f"max_completion_length must be None or a positive int, got {length!r}")
        if length is not None:
            object.__setattr__(self, "max_completion_length", int(length))
        if agg == "seq-mean-token-sum-norm" and length is None:
            raise ValueError(f"loss_agg={given!r} divides by the max completion length: set max_completion_length")
