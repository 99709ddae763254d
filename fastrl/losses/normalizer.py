"""`Normalizer`: a micro-batch's divisors (docs/math.md §3), what `policy_loss` takes as `normalizer=` and the
peers' normalizers (`fastrl.integrations.trl_normalizer` / `verl_normalizer`) return."""

from typing import NamedTuple

__all__ = ["Normalizer"]


class Normalizer(NamedTuple):
    """A micro-batch's divisors: `policy` as `normalizer=`; `accumulation_steps` divides the token-mean
    entropy bonus (`entropy_agg="token-mean"`), which is a mean over this call's tokens."""

    policy: object  # number, 1-element tensor or None (this call's count)
    accumulation_steps: float = 1.0
