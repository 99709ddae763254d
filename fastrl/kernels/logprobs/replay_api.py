"""`replayed_token_logprobs`: the checked entry point of the replay path, shaped like targets (docs/math.md §9)."""

import numbers

import torch

from ..dispatch import resolve_impl
from .api import check_call
from .kept_set import check_kept_set
from .replay import ReplayLogprobs, ReplayParams, replay_logprobs

__all__ = ["replayed_token_logprobs"]


def _scales(temperature, n: int, device) -> torch.Tensor:
    """`[N]` float32 factors of the capped logits: 1/τ, or 1/τ_t per token."""
    if isinstance(temperature, torch.Tensor):
        return 1.0 / temperature.detach().reshape(n).float()
    return torch.full((n,), 1.0 / float(temperature), dtype=torch.float32, device=device)


def replayed_token_logprobs(
    hidden, weight, targets, kept_ids, kept_offsets, *, bias=None, temperature=1.0, ignore_index=-100,
    impl="auto", softcap=None, return_topk=None, on_missing="raise",
) -> ReplayLogprobs:  # fmt: skip
    """Log-probs and entropy of the sampler's kept distributions, every output shaped like targets.

    `token_logprobs(..., kept_ids=, kept_offsets=)` with `on_missing="raise"`; the trainer passes "mask" and
    leaves the rows flagged in `missing` out of its loss. See `check_kept_set` for the CSR contract.
    """
    check_call(hidden, weight, targets, bias, temperature, ignore_index)
    if softcap is not None and (
        isinstance(softcap, bool) or not isinstance(softcap, numbers.Real) or not 0 < softcap < float("inf")
    ):
        raise ValueError(f"softcap must be a finite number > 0 or None, got {softcap!r}")
    vocab, lead = weight.shape[0], targets.shape
    if return_topk is not None and (
        isinstance(return_topk, bool) or not isinstance(return_topk, numbers.Integral) or return_topk < 1
    ):
        raise ValueError(f"return_topk must be None or an int >= 1, got {return_topk!r}")
    impl = resolve_impl(impl, hidden.device)
    t1 = targets.reshape(-1).long()
    n = t1.shape[0]
    kept = check_kept_set(kept_ids, kept_offsets, t1, int(ignore_index), vocab, on_missing)
    params = ReplayParams(int(ignore_index), None if softcap is None else float(softcap), impl)
    h2 = hidden.reshape(n, hidden.shape[-1])
    out = replay_logprobs(h2, weight, bias, t1, _scales(temperature, n, hidden.device), kept, params, return_topk)
    top = (None, None) if return_topk is None else (x.reshape(*lead, return_topk) for x in out[3:])
    return ReplayLogprobs(out.logp.reshape(lead), out.entropy.reshape(lead), out.missing.reshape(lead), *top)
