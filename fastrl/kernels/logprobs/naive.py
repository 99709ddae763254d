"""Eager full-logits reference: the test oracle and the benchmark baseline.

This is what TRL and most eager RL code do today: build the `[N, V]` logits, take a float32
log-softmax and gather one entry per row. Memory is O(N·V); the math is docs/math.md §1.
"""

import torch

from .params import LogprobParams

__all__ = ["token_logprobs_reference"]


def token_logprobs_reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    params: LogprobParams = LogprobParams(),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropy) by materializing the logits.

    Args:
        hidden: `[N, D]`. weight: `[V, D]`. targets: `[N]` int. bias: `[V]` or None.
    Returns:
        (logp `[N]` float32, entropy `[N]` float32 or None). Computation runs in float32 unless
        the inputs are float64 (then float64, for ground truths).
    """
    compute = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    z = logits.to(compute) / params.temperature
    logp_all = torch.log_softmax(z, dim=-1)
    valid = targets != params.ignore_index
    safe = torch.where(valid, targets, torch.zeros_like(targets))
    logp = logp_all.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    logp = torch.where(valid, logp, torch.zeros_like(logp))
    entropy = None
    if params.return_entropy:
        p = logp_all.exp()
        entropy = -(p * logp_all).sum(-1)
        entropy = torch.where(valid, entropy, torch.zeros_like(entropy))
    out_dtype = torch.float64 if compute == torch.float64 else torch.float32
    return logp.to(out_dtype), None if entropy is None else entropy.to(out_dtype)
