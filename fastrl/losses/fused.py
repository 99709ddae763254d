"""The loss side of the head glue: `grpo_loss` with its gradient formed in the forward pass (docs/math.md §7), and
the loss on the sampler's distribution (§8), which that pass cannot take.

The fused pass is taken for a token-level ratio when a gradient is wanted and nothing truncates or caps the
logits; `fused_grpo_parts` hands a config with the sampler on to `sampled_grpo_parts`. The loss value and the
metrics are those of `policy_loss` on the log-probs of the same pass (so they equal the two-pass path's); the
gradients of hidden, weight and bias come from `fastrl.kernels.fused_loss`, formed chunk by chunk in the forward and
handed to autograd by the backward.
"""

import torch

from fastrl.kernels import attach_gradients, policy_loss_grads, sampled_token_logprobs, token_logprobs

from .config import LossConfig
from .policy import LossOutput, Normalizer, aggregate, kernel_params, policy_loss
from .weights import policy_weight

__all__ = ["fusable_loss", "fused_grpo_loss", "fused_grpo_parts", "sampled_grpo_parts", "wants_fused"]


def wants_fused(hidden, weight, bias, config: LossConfig, old=None, rollout=None) -> bool:
    """True when the gradient-in-forward path applies: a gradient to form (grad mode on, and hidden, weight or
    bias requiring one) and a loss `fusable_loss` takes. `rollout` is accepted for the callers' symmetry."""
    if not torch.is_grad_enabled() or not fusable_loss(config, old):
        return False
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in (hidden, weight, bias))


def fusable_loss(config: LossConfig, old=None) -> bool:
    """A loss whose every token term depends on that token's own logp and entropy once the constants are known
    before the vocabulary pass.

    Left to the recompute path: a sequence-level ratio (GSPO, GSPO-token); policy weights that read the
    current log-probs (CISPO's clipped ratio, VESPO's sequence weight, the off-policy sequence mask, and an IS
    weight whose base is the current policy because old_logprobs is None); rejection sampling, which changes
    the mask; the batch entropy quantile; an entropy bonus aggregated apart from the loss; and the sampler's
    distribution (`config.sampler_on`: truncation or a soft-cap), whose log-probs that pass does not compute.
    """
    if config.ratio_level != "token" or config.sampler_on:
        return False
    if config.pg_loss not in ("clip", "sapo", "gpg") or config.off_policy_mask is not None or config.rejection:
        return False
    if config.top_entropy_quantile < 1 or (config.entropy_agg != "loss" and config.entropy_coef != 0):
        return False
    return not (config.is_cap is not None and old is None)


def _row_weight(mask: torch.Tensor, config: LossConfig, normalizer) -> torch.Tensor:
    # ∂L/∂row_loss_b of the aggregation (linear in row_loss), from the aggregation itself
    live = mask if mask.dtype == torch.bool else mask != 0
    tokens = live.sum(-1).float()
    probe = torch.zeros(mask.shape[0], dtype=torch.float32, device=mask.device, requires_grad=True)
    with torch.enable_grad():
        (weight,) = torch.autograd.grad(aggregate(probe, tokens, config, normalizer), probe)
    return weight


def fused_grpo_loss(hidden, weight, targets, mask, advantages, **options) -> LossOutput:
    """The LossOutput of `fused_grpo_parts` (same arguments)."""
    return fused_grpo_parts(hidden, weight, targets, mask, advantages, **options)[0]


def fused_grpo_parts(
    hidden,
    weight,
    targets,
    mask,
    advantages,
    *,
    bias,
    old,
    ref,
    rollout,
    config,
    normalizer,
    impl,
    temperature,
    return_entropy,
    ignore_index,
    batch_invariant=False,
):
    """`fused_grpo_loss`, and the pass's detached log-probs `[B, T]` and entropy `[B, T]` (or None) with it, for a
    caller that logs metrics of its own from them. `targets` hold `ignore_index` wherever mask is 0. A config with
    the sampler on (`config.sampler_on`) is the sampler's distribution: `sampled_grpo_parts` computes it."""
    if config.sampler_on:
        out, logp, entropy = sampled_grpo_parts(
            hidden, weight, targets, mask, advantages, bias=bias, old=old, ref=ref, rollout=rollout, config=config,
            normalizer=normalizer, impl=impl, temperature=temperature, return_entropy=return_entropy,
            ignore_index=ignore_index, batch_invariant=batch_invariant,
        )  # fmt: skip
        return out, logp.detach(), None if entropy is None else entropy.detach()
    need_entropy = config.entropy_coef != 0 or return_entropy
    b, t = mask.shape
    # The policy inputs and the normalizer are checked before any vocabulary work: the same call on zeros.
    zeros = torch.zeros(b, t, dtype=torch.float32, device=hidden.device)
    policy_loss(
        zeros,
        advantages,
        mask,
        old_logprobs=old,
        ref_logprobs=ref,
        rollout_logprobs=rollout,
        entropy=zeros if need_entropy else None,
        config=config,
        normalizer=normalizer,
        impl=impl,
    )
    # the policy term's detached factor (here only an IS weight from old and rollout log-probs: see
    # wants_fused) is known before the vocabulary pass; the zeros stand in for the current logp it ignores
    live = mask if mask.dtype == torch.bool else mask != 0
    adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1)
    token_weight, _, _ = policy_weight(config, zeros, old, rollout, live, adv, None)
    policy_normalizer = normalizer.policy if isinstance(normalizer, Normalizer) else normalizer
    logp, entropy, grads = policy_loss_grads(
        hidden,
        weight,
        targets,
        advantages,
        mask,
        old,
        ref,
        None if token_weight is None else token_weight.float(),
        kernel_params(config),
        _row_weight(mask, config, policy_normalizer),
        bias=bias,
        temperature=temperature,
        ignore_index=ignore_index,
        entropy=need_entropy,
        impl=impl,
        batch_invariant=batch_invariant,
    )
    out = policy_loss(
        logp,
        advantages,
        mask,
        old_logprobs=old,
        ref_logprobs=ref,
        rollout_logprobs=rollout,
        entropy=entropy,
        config=config,
        normalizer=normalizer,
        impl=impl,
    )
    return LossOutput(attach_gradients(out.loss.detach(), hidden, weight, bias, grads), out.metrics), logp, entropy


def sampled_grpo_parts(hidden, weight, targets, mask, advantages, *, bias, old, ref, rollout, config, normalizer, impl,
                       temperature, return_entropy, ignore_index, sampler=None, process_group=None,
                       kept=None, batch_invariant=False):  # fmt: skip
    """(LossOutput, logp, entropy) of the loss on the sampler's distribution (docs/math.md §8): its log-probs (two
    passes, no gradient-in-forward), then `policy_loss`; metrics["outside_kept_frac"] added. `sampler`: top_k /
    top_p / min_p (None: config's); with `process_group` the vocab-parallel call takes the soft-cap and refuses
    the truncation rules (each named). `kept`: the sampler's kept sets (kept_ids, kept_offsets), replayed; a live
    token whose target is outside its set is a ValueError naming it. `batch_invariant`: as `token_logprobs`'."""
    sampler = dict(top_k=config.top_k, top_p=config.top_p, min_p=config.min_p) if sampler is None else sampler
    need_entropy = config.entropy_coef != 0 or config.top_entropy_quantile < 1 or return_entropy
    options = dict(bias=bias, temperature=temperature, ignore_index=ignore_index, return_entropy=need_entropy,
                   impl=impl, softcap=config.softcap, batch_invariant=batch_invariant, **sampler)  # fmt: skip
    if kept is not None:
        options.update(kept_ids=kept[0], kept_offsets=kept[1])
    if process_group is None:
        out = sampled_token_logprobs(hidden, weight, targets, **options)
        logp, entropy, outside = out.logp, out.entropy, out.outside
        if kept is not None and bool(outside.any()):
            b, t = (int(x) for x in torch.nonzero(outside)[0])
            raise ValueError(
                f"the target at position ({b}, {t}) is not in its kept set (the sampler never kept it): set mask "
                "to 0 there to leave it out"
            )
    else:
        out = token_logprobs(hidden, weight, targets, process_group=process_group, **options)
        logp, entropy = out if need_entropy else (out, None)
        outside = torch.zeros(logp.shape, dtype=torch.bool, device=logp.device)  # nothing truncated
    res = policy_loss(logp, advantages, mask, old_logprobs=old, ref_logprobs=ref, rollout_logprobs=rollout,
                      entropy=entropy, config=config, normalizer=normalizer, impl=impl)  # fmt: skip
    live = mask if mask.dtype == torch.bool else mask != 0
    frac = (outside & live).sum().float() / live.sum().clamp(min=1).float()
    return LossOutput(res.loss, {**res.metrics, "outside_kept_frac": frac}), logp, entropy
