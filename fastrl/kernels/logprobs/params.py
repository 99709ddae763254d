"""The scalar parameters every token-log-prob implementation takes, frozen in one place."""

from dataclasses import dataclass
from typing import NamedTuple

import torch

__all__ = ["MIN_TEMPERATURE", "LogprobParams", "SampledLogprobs"]

# The logits are divided by the temperature in float32: far below 1e-6 even modest logits overflow to inf
# (and inf − inf is NaN), and below ~3e-39 1/temperature itself is not a float32.
MIN_TEMPERATURE = 1e-6


@dataclass(frozen=True)
class LogprobParams:
    temperature: float | torch.Tensor = 1.0  # logits are divided by it; > 0; or [N] float32, one per row
    ignore_index: int = -100  # targets equal to it give logp = H = 0 and no gradient
    return_entropy: bool = False  # also compute the softmax entropy (and carry its gradient)
    softcap: float | None = None  # final-logit soft-cap before the temperature: z = cap·tanh(x / cap) / τ; None = off
    batch_invariant: bool = False  # a row's results never depend on the other rows of the call (docs/math.md §1.2)


class SampledLogprobs(NamedTuple):
    """What every log-prob path returns over its `[N]` rows."""

    logp: torch.Tensor  # [N] float32
    entropy: torch.Tensor | None  # [N] float32, with return_entropy
    outside: torch.Tensor | None  # [N] bool: the target is not in the kept set (z_y < θ); None: nothing truncated
    topk_ids: torch.Tensor | None  # [N, k] int64, with return_topk
    topk_logprobs: torch.Tensor | None  # [N, k] float32 (−inf for a token outside S)
