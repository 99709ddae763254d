"""`policy_loss`: the PPO/GRPO policy loss from per-token log-probs (docs/math.md §2–3)."""

import dataclasses
import numbers
from typing import NamedTuple

import torch

from fastrl.kernels import STATS, PolicyLossParams, policy_rows, resolve_impl

from .call import PolicyInputs
from .config import LossConfig
from .normalizer import Normalizer
from .weights import policy_weight, rejection_keep

__all__ = [
    "METRIC_KEYS",
    "LossOutput",
    "Normalizer",
    "aggregate",
    "check_live_finite",
    "check_policy_inputs",
    "kernel_params",
    "policy_loss",
    "policy_loss_of",
]

# The per-token means a loss call can report in `LossOutput.metrics` (besides `num_tokens`), under the names
# the trainer logs them, each with the `STATS` column it averages (None: computed with the weights); a metric
# the configuration does not compute is absent from that call's dict.
_METRIC_COLUMNS = {
    "clip_frac_low": "clip_low",
    "clip_frac_high": "clip_high",
    "clip_frac_dual": "clip_dual",
    "ratio_mean": "ratio",
    "log_ratio_abs_mean": "log_ratio_abs",
    "kl_mean": "kl",
    "entropy_mean": "entropy",
    "is_weight_mean": None,
    "vespo_phi_mean": None,
    "off_policy_masked_frac": None,
    "rejected_frac": None,
}
METRIC_KEYS = tuple(_METRIC_COLUMNS)
_TOKENS = STATS.index("tokens")


class LossOutput(NamedTuple):
    loss: torch.Tensor  # scalar float32, differentiable
    metrics: dict  # name → detached 0-dim float32 tensor (no host sync); means over this call's masked tokens


def _tensor(name, t, *, optional=False):
    if t is None and optional:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor{' or None' if optional else ''}, got {type(t).__name__}")


def _check_logprobs(name: str, t, shape=None, dtype=None) -> None:
    _tensor(name, t, optional=shape is not None)
    if t is None:
        return
    if shape is None:
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got dtype {t.dtype}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be [B, T], got shape {tuple(t.shape)}")
        return
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} shape {tuple(t.shape)} must equal logprobs shape {shape}")
    if t.dtype != dtype:
        raise TypeError(f"{name} dtype {t.dtype} must equal logprobs dtype {dtype}")


def check_policy_inputs(p: PolicyInputs, shape: tuple, dtype: torch.dtype, device, has_entropy: bool) -> None:
    """The policy inputs of a call whose log-probs will be `[B, T]` = `shape` of `dtype` on `device` (checked before
    any vocabulary work); raise TypeError / ValueError naming the bad value (see `policy_loss`)."""
    advantages, mask = p.advantages, p.mask
    _tensor("advantages", advantages)
    _tensor("mask", mask)
    if tuple(mask.shape) != shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} must equal logprobs shape {shape}")
    if mask.is_complex():
        raise TypeError(f"mask must be bool, integer or floating 0/1, got dtype {mask.dtype}")
    if not advantages.is_floating_point():
        raise TypeError(f"advantages must be a floating tensor, got dtype {advantages.dtype}")
    if tuple(advantages.shape) not in (shape[:1], shape):
        raise ValueError(f"advantages must be [B] = {shape[:1]} or [B, T] = {shape}, got {tuple(advantages.shape)}")
    named = (("old_logprobs", p.old), ("ref_logprobs", p.ref), ("rollout_logprobs", p.rollout))
    for name, t in named:
        _check_logprobs(name, t, shape, dtype)
    for name, t in (("advantages", advantages), ("mask", mask)) + named:
        if t is not None and t.device != device:
            raise ValueError(f"{name} is on {t.device} but logprobs is on {device}")
    _check_needs(p, has_entropy)
    if mask.dtype != torch.bool and mask.numel() and bool(((mask != 0) & (mask != 1)).any()):
        bad = mask[(mask != 0) & (mask != 1)][0].item()
        raise ValueError(f"mask must hold only 0 and 1, found {bad}")
    per_token = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1).expand(shape)
    check_live_finite(p, (("advantages", per_token),) + named)


def _check_needs(p: PolicyInputs, has_entropy: bool) -> None:
    config, rollout = p.config, p.rollout
    if config.beta > 0 and p.ref is None:
        raise ValueError(f"config.beta={config.beta} > 0 needs ref_logprobs")
    if config.is_cap is not None and rollout is None:
        raise ValueError(f"config.is_cap={config.is_cap} needs rollout_logprobs (the sampler's log-probs)")
    if config.rejection and rollout is None:
        raise ValueError(f"config.rejection={config.rejection} needs rollout_logprobs (the sampler's log-probs)")
    if rollout is not None and config.is_cap is None and config.off_policy_mask is None and not config.rejection:
        raise ValueError(
            "rollout_logprobs was given but config.is_cap is None (and so are config.off_policy_mask and "
            "config.rejection): set is_cap to apply the IS weight"
        )
    if config.entropy_coef != 0 and not has_entropy:
        raise ValueError(f"config.entropy_coef={config.entropy_coef} != 0 needs entropy")
    if config.top_entropy_quantile < 1 and not has_entropy:
        raise ValueError(f"config.top_entropy_quantile={config.top_entropy_quantile} < 1 needs entropy")


def check_live_finite(p: PolicyInputs, named) -> None:
    """On the CPU, a NaN or inf where the mask is 1 is an error naming the tensor and position. On an accelerator
    this check would sync with the host, so there such a value propagates into a NaN loss, never a silently
    different one."""
    mask = p.mask
    if mask.device.type != "cpu" or not mask.numel():
        return
    live = p.live
    for name, t in named:
        bad = None if t is None else live & ~torch.isfinite(t.detach())
        if bad is not None and bool(bad.any()):
            b, i = bad.nonzero()[0].tolist()
            raise ValueError(f"{name} is {t[b, i].item()} at position [{b}, {i}], where mask is 1")


def _count(value, name: str, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex() or value.dtype == torch.bool:
            raise ValueError(f"{name} tensor must be one real number, got shape {tuple(value.shape)} {value.dtype}")
        norm = value.detach().reshape(()).to(device=device, dtype=torch.float32)
        if value.device.type == "cpu" and not 0 <= float(value) < float("inf"):
            raise ValueError(f"{name} must be a finite count >= 0, got {float(value)}")
        # On an accelerator a check would sync with the host: a negative or NaN count gives a NaN loss
        # instead (below), never a silently rescaled one.
        return torch.where((norm >= 0) & norm.isfinite(), norm, torch.full_like(norm, float("nan")))
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, a 1-element tensor or None, got {type(value).__name__}")
    if not 0 <= value < float("inf"):
        raise ValueError(f"{name} must be a finite count >= 0, got {value}")
    return torch.full((), float(value), dtype=torch.float32, device=device)


def _normalizer(normalizer, default: torch.Tensor) -> torch.Tensor:
    norm = default if normalizer is None else _count(normalizer, "normalizer", default.device)
    # An empty step (count 0) has a zero numerator: divide by 1 to return 0, not 0/0.
    return torch.where(norm == 0, torch.ones_like(norm), norm)


def aggregate(row_loss: torch.Tensor, tokens: torch.Tensor, config: LossConfig, normalizer) -> torch.Tensor:
    """docs/math.md §3: per-sequence masked sums `[B]` and token counts `[B]` → the scalar loss."""
    if config.count_empty_rows:
        # torch.full, not torch.tensor: a fill kernel, no blocking host-to-device copy on CUDA
        rows = torch.full((), float(row_loss.shape[0]), dtype=torch.float32, device=row_loss.device)
    else:
        rows = (tokens > 0).sum().to(torch.float32)
    if config.loss_agg == "token-mean":
        numerator, default = row_loss.sum(), tokens.sum()
    elif config.loss_agg == "token-sum":
        numerator, default = row_loss.sum(), torch.ones((), dtype=torch.float32, device=row_loss.device)
    elif config.loss_agg == "seq-mean-token-mean":
        numerator, default = (row_loss / tokens.clamp(min=1)).sum(), rows
    elif config.loss_agg == "seq-mean-token-sum":
        numerator, default = row_loss.sum(), rows
    else:
        numerator, default = row_loss.sum() / config.max_completion_length, rows
    return numerator / _normalizer(normalizer, default)


def kernel_params(config: LossConfig) -> PolicyLossParams:
    """The only map from a `LossConfig` to the kernels' `PolicyLossParams`.

    Every kernel field but `pg` is the `LossConfig` field of the same name (numbers as Python floats), with
    two exceptions: `entropy_coef` is 0 when the bonus is a token mean added outside the kernel
    (`entropy_agg="token-mean"`), and `dual_clip` is None for a policy term other than the clip. `pg` is
    the kernel's policy term: "clip", "sapo", or "linear" (−A·logp) for cispo / gpg / vespo, whose
    weights the caller computes. The other knobs act outside the per-token kernel.
    """
    fields = {}
    for field in dataclasses.fields(PolicyLossParams):
        if field.name == "pg":
            continue
        value = getattr(config, field.name)
        fields[field.name] = value if value is None or isinstance(value, (str, bool)) else float(value)
    pg = config.pg_loss if config.pg_loss in ("clip", "sapo") else "linear"
    if config.entropy_agg != "loss":
        fields["entropy_coef"] = 0.0
    if pg != "clip":
        fields["dual_clip"] = None
    return PolicyLossParams(**fields, pg=pg)


def _metrics_from_stats(stats: torch.Tensor, config: LossConfig, has_ref: bool, has_entropy: bool):
    """`[B, NUM_STATS]` per-sequence sums → the kernel's METRIC_KEYS present in this call and "num_tokens"."""
    totals = dict(zip(STATS, stats.sum(0).unbind()))
    tokens = totals["tokens"]
    denom = tokens.clamp(min=1)
    clip = config.pg_loss == "clip"
    absent = {
        "clip_frac_low": not clip,
        "clip_frac_high": not clip,
        "clip_frac_dual": config.dual_clip is None or not clip,
        "kl_mean": not has_ref,
        "entropy_mean": not has_entropy,
    }
    metrics = {key: totals[col] / denom for key, col in _METRIC_COLUMNS.items() if col and not absent.get(key, False)}
    metrics["num_tokens"] = tokens
    return metrics


def _entropy_bonus(entropy, m, h_mask, config: LossConfig, steps) -> torch.Tensor:
    # TRL's entropy bonus: a mean over this call's (entropy-masked) tokens, whatever the loss mode
    live = m if h_mask is None else m & h_mask
    h = torch.where(live, entropy, 0.0).sum(dtype=torch.float32 if entropy.dtype != torch.float64 else None)
    mean = h / live.sum().clamp(min=1)
    return -config.entropy_coef * mean / _normalizer(steps, torch.ones((), device=m.device))


def policy_loss(
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    config: LossConfig | None = None,
    normalizer=None,
    impl: str = "auto",
) -> LossOutput:
    """Clipped policy-gradient loss with KL, entropy bonus and rollout IS correction (docs/math.md §2–3).

    Args:
        logprobs: `[B, T]` log π(y_t) of the current policy (differentiable).
        advantages: `[B]` (one per sequence) or `[B, T]` (per token); a constant.
        mask: `[B, T]` bool or 0/1; 1 = completion token that counts. Masked positions may hold anything.
        old_logprobs: `[B, T]` log-probs of the policy that sampled the batch; None = on-policy
            (ratio 1, gradient −A·∇logp).
        ref_logprobs: `[B, T]` reference-model log-probs; needed when config.beta > 0, else metric only.
        rollout_logprobs: `[B, T]` the inference engine's log-probs; with config.is_cap they give the
            detached IS weight from exp(old − rollout) (config.is_level / is_mode / is_min), and
            config.off_policy_mask measures its sequences' drift against them.
        entropy: `[B, T]` per-token entropy (differentiable); needed when config.entropy_coef != 0 or
            config.top_entropy_quantile < 1.
        config: a `LossConfig` (default `LossConfig()`).
        normalizer: the GLOBAL count of the optimizer step (tokens for token-mean, sequences for the
            seq-mean modes) when one step is split over micro-batches or ranks, or a `Normalizer`
            (`fastrl.integrations.trl_normalizer` / `verl_normalizer` give the peers'); default: this batch's.
        impl: "auto" (Triton on CUDA, PyTorch elsewhere), "triton" or "torch".

    Returns:
        LossOutput(loss, metrics). metrics: clip_frac_low, clip_frac_high, ratio_mean, log_ratio_abs_mean
        (of the ratio actually used, i.e. the sequence ratio under GSPO), clip_frac_dual with dual_clip,
        kl_mean with ref_logprobs, entropy_mean with entropy, is_weight_mean with the IS weight,
        vespo_phi_mean, off_policy_masked_frac with those terms, and num_tokens; means are over this
        call's masked tokens (0 when there are none).
    """
    config = LossConfig() if config is None else config
    if not isinstance(config, LossConfig):
        raise TypeError(f"config must be a LossConfig or None, got {type(config).__name__}")
    p = PolicyInputs(advantages, mask, old_logprobs, ref_logprobs, rollout_logprobs, config, normalizer, impl)
    _check_logprobs("logprobs", logprobs)
    shape = tuple(logprobs.shape)
    _check_logprobs("entropy", entropy, shape, logprobs.dtype)
    if entropy is not None and entropy.device != logprobs.device:
        raise ValueError(f"entropy is on {entropy.device} but logprobs is on {logprobs.device}")
    check_policy_inputs(p, shape, logprobs.dtype, logprobs.device, entropy is not None)
    check_live_finite(p, (("logprobs", logprobs), ("entropy", entropy)))
    return policy_loss_of(logprobs, entropy, p)


def policy_loss_of(logprobs: torch.Tensor, entropy: torch.Tensor | None, p: PolicyInputs) -> LossOutput:
    """`policy_loss` of a checked call (`check_policy_inputs` and the log-probs' own checks have run)."""
    config, old_logprobs, rollout_logprobs, impl = p.config, p.old, p.rollout, p.impl
    mask, normalizer, steps = p.mask, p.normalizer, 1.0
    if isinstance(normalizer, Normalizer):
        normalizer, steps = normalizer.policy, normalizer.accumulation_steps
    m = p.live
    m_in, rejected = m, None
    if config.rejection:  # the rejected tokens leave the loss, its counts and metrics
        m = rejection_keep(logprobs, old_logprobs, rollout_logprobs, m_in, config.rejection)
        mask, rejected = m, (m_in & ~m).sum() / m_in.sum().clamp(min=1)
    adv = p.advantages if p.advantages.dim() == 2 else p.advantages.unsqueeze(-1)
    weight, h_mask, extra = policy_weight(
        config, logprobs, old_logprobs, rollout_logprobs, m, adv, entropy, is_mask=m_in
    )
    if rejected is not None:
        extra["rejected_frac"] = rejected.float()
    if weight is not None and resolve_impl(impl, logprobs.device) == "triton":
        weight = weight.float()
    row_loss, stats = policy_rows(
        logprobs, p.advantages, mask, old_logprobs, p.ref, weight, entropy, kernel_params(config), impl=impl
    )
    loss = aggregate(row_loss, stats[:, _TOKENS].to(row_loss.dtype), config, normalizer)
    if config.entropy_agg == "token-mean" and config.entropy_coef != 0:
        loss = loss + _entropy_bonus(entropy, m, h_mask, config, steps).to(loss.dtype)
    metrics = _metrics_from_stats(stats, config, p.ref is not None, entropy is not None)
    metrics.update(extra)
    return LossOutput(loss, metrics)
