"""Eager reference of the replay op: materialized `[N, V]` logits with the kept sets as a mask (the oracle)."""

import torch

from .naive import sampled_logits

__all__ = ["kept_mask", "replay_logprobs_reference"]


def kept_mask(kept_ids: torch.Tensor, kept_offsets: torch.Tensor, n: int, vocab: int) -> torch.Tensor:
    """`[N, V]` bool: True at each row's kept ids (CSR `kept_ids` / `kept_offsets`, docs/math.md §9)."""
    rows = torch.repeat_interleave(torch.arange(n, device=kept_ids.device), kept_offsets.long().diff())
    mask = torch.zeros(n, vocab, dtype=torch.bool, device=kept_ids.device)
    mask[rows, kept_ids.long()] = True
    return mask


def replay_logprobs_reference(
    hidden, weight, targets, kept_ids, kept_offsets, bias=None, *, temperature=1.0, softcap=None, ignore_index=-100
) -> dict:
    """logp = z_y − log Σ_S exp z and the entropy of softmax over S, z = softcap(h·Wᵀ + b) / τ, on materialized
    logits (float64 for float64 inputs, else float32), differentiable by autograd. Returns {"logp", "entropy"}."""
    z = sampled_logits(hidden, weight, bias, softcap, temperature)
    kept = kept_mask(kept_ids, kept_offsets, z.shape[0], z.shape[1])
    z_s = z.masked_fill(~kept, float("-inf"))
    valid = targets != ignore_index
    lse = torch.where(valid, torch.logsumexp(torch.where(valid.unsqueeze(1), z_s, 0.0), -1), 0.0)
    safe = torch.where(valid, targets, torch.zeros_like(targets))
    logp = torch.where(valid, z.gather(-1, safe.unsqueeze(-1)).squeeze(-1) - lse, 0.0)
    p = torch.exp(z_s - lse.unsqueeze(-1))
    entropy = torch.where(valid, lse - (p * z.masked_fill(~kept, 0.0)).sum(-1), 0.0)
    return {"logp": logp, "entropy": entropy}
