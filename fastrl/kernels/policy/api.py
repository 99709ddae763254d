"""`policy_rows`: the public entry point of the per-token policy-loss op (docs/math.md §2)."""

import torch

from ..dispatch import resolve_impl
from .naive import policy_rows_torch
from .params import PolicyLossParams

__all__ = ["policy_rows", "policy_rows_impl"]


def policy_rows_impl(impl: str):
    """The per-token policy-loss function (row_loss, stats) of a resolved `impl` ("triton" or "torch")."""
    if impl == "triton":
        from .function import policy_rows_triton

        return policy_rows_triton
    return policy_rows_torch


def policy_rows(
    logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    old: torch.Tensor | None,
    ref: torch.Tensor | None,
    weight: torch.Tensor | None,
    entropy: torch.Tensor | None,
    params: PolicyLossParams,
    *,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence loss sums and statistics of the clipped policy loss, Triton or PyTorch.

    The inputs are validated by the caller (`fastrl.losses.policy_loss` checks shapes, dtypes, devices).

    Args:
        logp: `[B, T]` log-probs of the current policy (differentiable).
        advantages: `[B]` or `[B, T]`; mask: `[B, T]` bool or 0/1.
        old, ref: `[B, T]` constants or None; weight: `[B, T]` detached factor of the policy term (importance
            weights, masks) or None; entropy: `[B, T]` (differentiable) or None.
        params: the frozen scalars of the loss.
        impl: "auto" (Triton on CUDA, PyTorch elsewhere), "triton" or "torch".

    Returns:
        row_loss `[B]` (Σ_t m·ℓ, differentiable) and stats `[B, NUM_STATS]` float32 (detached masked sums,
        columns named by `STATS`).
    """
    fn = policy_rows_impl(resolve_impl(impl, logp.device))
    return fn(logp, advantages, mask, old, ref, weight, entropy, params)
