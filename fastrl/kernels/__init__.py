"""fastrl's ops, laid out one package per op (docs/math.md §1–2).

    logprobs/    per-token log-probabilities and entropy from hidden states, without the `[N, V]` logits
    policy/      the per-token policy loss reduced to per-sequence sums and statistics
    fused_loss/  the GRPO loss with its gradients computed in the forward pass (one pass over the vocabulary)
    sampler.py   `SamplerSettings`: temperature, top-k, top-p, min-p and soft-cap in one frozen object
    dispatch.py  `impl` ("auto" / "triton" / "torch") resolved for a device
    logits.py    the float32 logit tile of every PyTorch walk, and the autocast guard
    configs.py   every Triton launch constant and `triton.Config`
    budgets.py   the PyTorch walks' chunk budgets (FASTRL_CHUNK_BYTES), importable without triton

Imports only torch (and triton, when a Triton path runs).
"""

from .dispatch import IMPLS, resolve_impl
from .fused_loss import PolicyTokens, attach_gradients, fused_logprob_grads, take_weight_gradient
from .logprobs import (
    MIN_TEMPERATURE,
    LogprobParams,
    LogprobRequest,
    check_temperature,
    keep_rows,
    kept_set_from_vllm,
    logprob_call,
    logprob_path,
    replay_logprobs_reference,
    sampled_logprobs_reference,
    sampled_token_logprobs,
    sampler_on,
    shape_logprobs,
    token_logprobs,
    token_logprobs_reference,
)
from .policy import NUM_STATS, STATS, PolicyLossParams, policy_rows, policy_rows_torch
from .sampler import SamplerSettings

__all__ = [
    "IMPLS",
    "MIN_TEMPERATURE",
    "NUM_STATS",
    "STATS",
    "attach_gradients",
    "fused_logprob_grads",
    "check_temperature",
    "keep_rows",
    "kept_set_from_vllm",
    "logprob_call",
    "logprob_path",
    "replay_logprobs_reference",
    "LogprobParams",
    "LogprobRequest",
    "PolicyLossParams",
    "PolicyTokens",
    "policy_rows",
    "policy_rows_torch",
    "resolve_impl",
    "SamplerSettings",
    "sampled_logprobs_reference",
    "sampled_token_logprobs",
    "sampler_on",
    "shape_logprobs",
    "take_weight_gradient",
    "token_logprobs",
    "token_logprobs_reference",
]
