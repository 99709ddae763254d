"""Per-token log-probabilities (and entropy) from hidden states, without the `[N, V]` logits."""

from .api import token_logprobs
from .params import LogprobParams
from .reference import token_logprobs_reference

__all__ = ["LogprobParams", "token_logprobs", "token_logprobs_reference"]
