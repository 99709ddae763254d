"""`Normalizer`: a micro-batch's divisors (docs/math.md §3), in a module of its own so that the peer adapters
(`trl_compat`, `verl_compat`), which `LossConfig.from_trl` / `from_verl` import, and `policy_loss`, which takes
it, all depend on it without depending on each other."""

from typing import NamedTuple

__all__ = ["Normalizer"]


class Normalizer(NamedTuple):
    """A micro-batch's divisors: `policy` as `normalizer=`; `accumulation_steps` divides the token-mean
    entropy bonus (`entropy_agg="token-mean"`), which is a mean over this call's tokens."""

    policy: object  # number, 1-element tensor or None (this call's count)
    accumulation_steps: float = 1.0
