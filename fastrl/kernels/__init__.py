"""fastrl's ops, laid out one package per op (docs/math.md §1–2).

    logprobs/    per-token log-probabilities and entropy from hidden states, without the `[N, V]` logits
    policy/      the per-token policy loss reduced to per-sequence sums and statistics
    dispatch.py  `impl` ("auto" / "triton" / "torch") → the implementation that runs, for both ops
    configs.py   every Triton launch constant and `triton.Config`

Imports only torch (and triton, when a Triton path runs).
"""

from .dispatch import IMPLS, resolve_impl
from .fused_loss import attach_gradients, policy_loss_grads
from .logprobs import (
    LogprobParams,
    sampled_logprobs_reference,
    sampled_token_logprobs,
    token_logprobs,
    token_logprobs_reference,
)
from .policy import NUM_STATS, STATS, PolicyLossParams, policy_rows, policy_rows_torch

__all__ = [
    "IMPLS",
    "NUM_STATS",
    "STATS",
    "attach_gradients",
    "LogprobParams",
    "PolicyLossParams",
    "policy_loss_grads",
    "policy_rows",
    "policy_rows_torch",
    "resolve_impl",
    "sampled_logprobs_reference",
    "sampled_token_logprobs",
    "token_logprobs",
    "token_logprobs_reference",
]
