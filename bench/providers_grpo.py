"""grpo_loss providers: fn(hidden [B, T, D], weight, targets [B, T], mask, advantages [B], old, ref, config) -> loss.

Every peer scores the live positions only (`hidden[mask]`, as TRL does on Triton devices), then applies the
same per-token loss (`fastrl.policy_loss`, or TRL's own loss code for `trl`); fastrl gets the whole batch and
leaves the masked positions out itself. Liger takes `[B, T]` with the mask (its interface) and runs with its
defaults (`compiled=True`). `trl-all-rows` is TRL's trainer on a device without Triton (every position
scored), a separate, labelled row.
"""

from typing import Callable

import torch

import fastrl
from bench.floors import blas_floor
from bench.peers import (
    cce_token_logprobs,
    liger_grpo_loss,
    torch_lce_token_logprobs,
    trl_grpo_loss,
)
from bench.providers import Provider, always, compile_failure, eager_token_logprobs, package_unavailable
from bench.providers import triton_unavailable as _triton_unavailable


def _live_logp(hidden, weight, targets, mask, logp_fn) -> torch.Tensor:
    """`logp_fn` on the live rows, scattered back into `[B, T]` (zeros at masked positions)."""
    b, t, d = hidden.shape
    rows = torch.nonzero(mask.reshape(-1)).squeeze(-1)
    live = logp_fn(hidden.reshape(-1, d).index_select(0, rows), weight, targets.reshape(-1).index_select(0, rows))
    return live.new_zeros(b * t).index_copy(0, rows, live).view(b, t)


def on_live_rows(logp_fn: Callable, name: str) -> Callable:
    """A log-prob function of (h [n, D], W, y [n]) on the live rows, then the per-token loss."""

    def fn(hidden, weight, targets, mask, advantages, old, ref, config):
        if config.entropy_coef != 0:
            raise ValueError(f"the bench's {name} provider returns no entropy: entropy_coef={config.entropy_coef}")
        h = hidden if config.temperature == 1.0 else hidden / config.temperature  # (h/τ)·Wᵀ = z/τ
        logp = _live_logp(h, weight, targets, mask, logp_fn)
        return fastrl.policy_loss(
            logp, advantages, mask, old_logprobs=old, ref_logprobs=ref, config=config, impl="torch"
        ).loss

    return fn


def fastrl_grpo_loss(impl: str) -> Callable:
    def fn(hidden, weight, targets, mask, advantages, old, ref, config):
        return fastrl.grpo_loss(
            hidden, weight, targets, mask, advantages, old_logprobs=old, ref_logprobs=ref, config=config, impl=impl
        ).loss

    return fn


def fastrl_recompute_grpo_loss(hidden, weight, targets, mask, advantages, old, ref, config):
    """fastrl's two-pass path: token_logprobs (its backward recomputes the tiles), then policy_loss."""
    need_entropy = config.entropy_coef != 0
    live = torch.where(mask, targets, torch.full_like(targets, -100))
    out = fastrl.token_logprobs(
        hidden, weight, live, temperature=config.temperature, return_entropy=need_entropy, impl="torch"
    )
    logp, entropy = out if need_entropy else (out, None)
    return fastrl.policy_loss(
        logp, advantages, mask, old_logprobs=old, ref_logprobs=ref, entropy=entropy, config=config, impl="torch"
    ).loss


def trl_live_grpo_loss(hidden, weight, targets, mask, advantages, old, ref, config):
    return trl_grpo_loss(hidden, weight, targets, mask, advantages, old, ref, config, live_only=True)


def floor_grpo_loss(hidden, weight, targets, mask, advantages, old, ref, config):
    rows = torch.nonzero(mask.reshape(-1)).squeeze(-1)
    return blas_floor(hidden.reshape(-1, hidden.shape[-1]).index_select(0, rows), weight).sum()


_trl, _liger, _cce = (package_unavailable(m, False) for m in ("trl", "liger_kernel", "cut_cross_entropy"))
GRPO_LOSS_PROVIDERS = {
    "eager": Provider("eager", on_live_rows(eager_token_logprobs, "eager"), always),
    "compile": Provider(
        "compile", on_live_rows(compile_failure(eager_token_logprobs), "compile"), always, compiles=True
    ),
    "fastrl-torch": Provider("fastrl-torch", fastrl_grpo_loss("torch"), always),
    "fastrl-triton": Provider("fastrl-triton", fastrl_grpo_loss("triton"), _triton_unavailable, compiles=True),
    "fastrl-recompute": Provider("fastrl-recompute", fastrl_recompute_grpo_loss, always, recomputes=True),
    "trl": Provider("trl", trl_live_grpo_loss, _trl, recomputes=True),
    "trl-all-rows": Provider("trl-all-rows", trl_grpo_loss, _trl, recomputes=True, all_rows=True),
    "liger": Provider("liger", liger_grpo_loss, _liger, True, all_rows=True),  # [B, T] in: every position scored
    "cce": Provider("cce", on_live_rows(cce_token_logprobs, "cce"), _cce, True),  # CPU: keeps the logits
    "torch-lce": Provider("torch-lce", on_live_rows(torch_lce_token_logprobs, "torch-lce"), always, recomputes=True),
    "blas-floor": Provider("blas-floor", floor_grpo_loss, always, compiles=True, floor=True),
}
