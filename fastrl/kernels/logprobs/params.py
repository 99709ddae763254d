"""The scalar parameters every token-log-prob implementation takes, frozen in one place."""

from dataclasses import dataclass

__all__ = ["LogprobParams"]


@dataclass(frozen=True)
class LogprobParams:
    temperature: float = 1.0  # logits are divided by it; > 0
    ignore_index: int = -100  # targets equal to it give logp = H = 0 and no gradient
    return_entropy: bool = False  # also compute the softmax entropy (and carry its gradient)
