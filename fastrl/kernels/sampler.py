"""`SamplerSettings`: the sampler's distribution in one frozen object (docs/math.md §8).

The temperature, vLLM's truncation (min-p, then top-k, then top-p on what is left) and the model's final-logit
soft-cap. The loss must score the distribution the completions were drawn from, so the trainer's config, the loss
config and the rollout engines all read these five settings from here.

"Off" has one spelling, None. The spellings samplers and command lines use for off (`top_k=0` or vLLM's `-1`,
`top_p=1.0`, `min_p=0.0`) are accepted and stored as None, so existing flags and config keys keep working.
"""

import numbers
from dataclasses import asdict, dataclass

from .logprobs.checks import check_softcap, check_temperature

__all__ = ["SamplerSettings"]

_TOP_K_OFF = (0, -1)  # the off values of samplers' top_k: 0 (Hugging Face, our CLI), -1 (vLLM)


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float or None, got {type(value).__name__} {value!r}")
    return float(value)


def _top_k(value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"top_k must be an int or None, got {type(value).__name__} {value!r}")
    if value in _TOP_K_OFF:
        return None
    if value < 0:
        raise ValueError(f"top_k must be None, 0 or -1 (off) or a positive int, got {value}")
    return int(value)


def _top_p(value) -> float | None:
    if value is None:
        return None
    p = _real("top_p", value)
    if not 0 < p <= 1:
        raise ValueError(f"top_p must be None or in (0, 1] (1: off), got {value}")
    return None if p == 1 else p


def _min_p(value) -> float | None:
    if value is None:
        return None
    m = _real("min_p", value)
    if not 0 <= m <= 1:
        raise ValueError(f"min_p must be None or in [0, 1] (0: off), got {value}")
    return None if m == 0 else m


@dataclass(frozen=True)
class SamplerSettings:
    """The sampler's settings, checked on construction; each truncation rule and the soft-cap is None when off.

    Raises:
        TypeError / ValueError naming the bad setting and its value.
    """

    temperature: float = 1.0  # the final logits are divided by it; finite and >= MIN_TEMPERATURE
    top_k: int | None = None  # keep the k most likely tokens (0 or -1 given: stored as None)
    top_p: float | None = None  # nucleus: keep tokens whose higher-ranked mass is < top_p (1.0 given: None)
    min_p: float | None = None  # drop tokens below min_p × the most likely one's probability (0.0 given: None)
    softcap: float | None = None  # the model's final-logit soft-cap cap·tanh(x / cap), before the temperature

    def __post_init__(self):
        check_temperature(self.temperature)
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_k", _top_k(self.top_k))
        object.__setattr__(self, "top_p", _top_p(self.top_p))
        object.__setattr__(self, "min_p", _min_p(self.min_p))
        object.__setattr__(self, "softcap", check_softcap(self.softcap))

    @property
    def truncates(self) -> bool:
        """Whether a rule (top-k, top-p, min-p) may drop tokens: the sampler has a kept set to replay."""
        return self.top_k is not None or self.top_p is not None or self.min_p is not None

    @property
    def on(self) -> bool:
        """Whether the log-probs are those of a truncated or soft-capped distribution (docs/math.md §8)."""
        return self.truncates or self.softcap is not None

    def truncation(self) -> dict:
        """`{"top_k", "top_p", "min_p"}`: the truncation keywords of `token_logprobs` / `grpo_loss`."""
        return {"top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p}

    def engine_kwargs(self) -> dict:
        """The settings in the numbers a sampler takes (vLLM's `SamplingParams`, Hugging Face's `generate`), where
        off is `top_k=0`, `top_p=1.0`, `min_p=0.0`; the soft-cap is the model's and is not among them."""
        top_k = 0 if self.top_k is None else self.top_k
        top_p = 1.0 if self.top_p is None else self.top_p
        return {"temperature": self.temperature, "top_k": top_k, "top_p": top_p, "min_p": self.min_p or 0.0}

    def as_dict(self) -> dict:
        """The five settings by name (the keywords of `SamplerSettings` and of `LossConfig`)."""
        return asdict(self)
