"""The one router of the loss and the paths it picks (docs/math.md §7–9). `route(call)` names the path of a checked
`LossCall`, `run(call)` runs it; each path returns (LossOutput, logp, entropy):

    replay          kept_ids / kept_offsets given: softmax over the sampler's own kept sets (sampled_parts)
    sampled         a truncation rule or a soft-cap on: the sampler's distribution (sampled_parts)
    vocab_parallel  a process group: the head's rows split over the ranks (two_pass_parts)
    fused           a token-level loss and a gradient to form: the gradients of hidden, weight and bias formed chunk
                    by chunk in the forward pass (`fastrl.kernels.fused_loss`, §7), handed to autograd by the
                    backward (fused_parts)
    plain           otherwise: the log-probs of `token_logprobs`, then the policy loss (two_pass_parts)

Every path computes the loss value and the metrics with `policy_loss_of` on its own log-probs, so each equals the
two-pass composition `token_logprobs` → `policy_loss`.
"""

import dataclasses

import torch

from fastrl.kernels import (
    PolicyTokens,
    attach_gradients,
    fused_logprob_grads,
    logprob_call,
    logprob_path,
    sampler_on,
    shape_logprobs,
)

from .call import LossCall
from .config import LossConfig
from .policy import LossOutput, Normalizer, aggregate, check_live_finite, kernel_params, policy_loss_of
from .weights import policy_weight

__all__ = ["ROUTES", "fusable_loss", "fused_parts", "route", "run", "sampled_parts", "two_pass_parts", "wants_fused"]


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


def wants_fused(hidden, weight, bias, config: LossConfig, old=None, rollout=None) -> bool:
    """True when the gradient-in-forward path applies: a gradient to form (grad mode on, and hidden, weight or
    bias requiring one) and a loss `fusable_loss` takes. `rollout` is accepted for the callers' symmetry."""
    if not torch.is_grad_enabled() or not fusable_loss(config, old):
        return False
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in (hidden, weight, bias))


def route(call: LossCall) -> str:
    """The path of a checked call: "replay", "sampled", "vocab_parallel", "fused" or "plain" (module docstring)."""
    if call.kept is not None:
        return "replay"
    if sampler_on(**call.sampler, softcap=call.config.softcap):
        return "sampled"
    if call.group is not None:
        return "vocab_parallel"
    policy = call.policy
    return "fused" if wants_fused(call.hidden, call.weight, call.bias, call.config, policy.old) else "plain"


def _row_weight(mask: torch.Tensor, config, normalizer) -> torch.Tensor:
    # ∂L/∂row_loss_b of the aggregation (linear in row_loss), from the aggregation itself
    live = mask if mask.dtype == torch.bool else mask != 0
    tokens = live.sum(-1).float()
    probe = torch.zeros(mask.shape[0], dtype=torch.float32, device=mask.device, requires_grad=True)
    with torch.enable_grad():
        (weight,) = torch.autograd.grad(aggregate(probe, tokens, config, normalizer), probe)
    return weight


def _loss(call: LossCall, logp: torch.Tensor, entropy: torch.Tensor | None) -> LossOutput:
    check_live_finite(call.policy, (("logprobs", logp), ("entropy", entropy)))
    return policy_loss_of(logp, entropy, call.policy)


def _logprob_call(call: LossCall, group, **options):
    # the log-prob op's own checked call over the [N] rows, and targets' shape; options: this path's request fields
    request = dataclasses.replace(call.logprob_options(), process_group=group, **options)
    return logprob_call(call.hidden, call.weight, call.targets, request)


def _logprobs(call: LossCall, group, **options):
    # the log-prob op's call, run on the path it picks from here: no public entry between this router and the walk
    # (SampledLogprobs shape_logprobs like targets)
    lp_call, lead = _logprob_call(call, group, **options)
    return shape_logprobs(logprob_path(lp_call)(lp_call), lp_call, lead)


def fused_parts(call: LossCall):
    """The loss with its gradients formed in the vocabulary pass; logp and entropy come back detached."""
    p, config = call.policy, call.config
    # the full softmax: the request's sampler fields stay off
    lp_call, lead = _logprob_call(call, None, return_entropy=config.entropy_coef != 0 or call.return_entropy)
    adv = p.advantages if p.advantages.dim() == 2 else p.advantages.unsqueeze(-1)
    # the policy term's detached factor (here only an IS weight from old and rollout log-probs: see
    # `fusable_loss`) is known before the pass; zeros stand in for the current logp it does not read
    zeros = torch.zeros(p.mask.shape, dtype=torch.float32, device=call.hidden.device)
    token_weight, _, _ = policy_weight(config, zeros, p.old, p.rollout, p.live, adv, None)
    policy_normalizer = p.normalizer.policy if isinstance(p.normalizer, Normalizer) else p.normalizer
    row_weight = _row_weight(p.mask, config, policy_normalizer)
    token_weight = None if token_weight is None else token_weight.float()
    params = kernel_params(config)
    tokens = PolicyTokens(p.advantages, p.mask, p.old, p.ref, token_weight, params, row_weight, lp_call.impl)
    logp, entropy, (d_hidden, d_weight, d_bias) = fused_logprob_grads(lp_call, tokens, params.entropy_coef != 0)
    logp, entropy = logp.reshape(lead), None if entropy is None else entropy.reshape(lead)
    d_hidden = None if d_hidden is None else d_hidden.reshape(call.hidden.shape)
    out = _loss(call, logp, entropy)
    loss = attach_gradients(out.loss.detach(), call.hidden, call.weight, call.bias, (d_hidden, d_weight, d_bias))
    return LossOutput(loss, out.metrics), logp, entropy


def sampled_parts(call: LossCall):
    """The loss on the sampler's distribution: its log-probs (two passes, no gradient-in-forward), then the policy
    loss; metrics["outside_kept_frac"] added. With kept sets, a live token whose target is outside its set is a
    ValueError naming it; with a process group the vocab-parallel op takes the soft-cap (and refuses truncation)."""
    need_entropy = call.entropy_wanted
    options = dict(return_entropy=need_entropy, softcap=call.config.softcap, **call.sampler)
    if call.kept is not None:
        options.update(kept_ids=call.kept[0], kept_offsets=call.kept[1])
    if call.group is None:
        out = _logprobs(call, None, on_missing="mask", **options)
        logp, entropy, outside = out.logp, out.entropy, out.outside
        if call.kept is not None and bool(outside.any()):
            b, t = (int(x) for x in torch.nonzero(outside)[0])
            raise ValueError(
                f"the target at position ({b}, {t}) is not in its kept set (the sampler never kept it): set mask "
                "to 0 there to leave it out"
            )
    else:
        out = _logprobs(call, call.group, **options)
        logp, entropy = out.logp, out.entropy
        outside = torch.zeros(logp.shape, dtype=torch.bool, device=logp.device)  # nothing truncated
    res = _loss(call, logp, entropy)
    live = call.policy.live
    frac = (outside & live).sum().float() / live.sum().clamp(min=1).float()
    return LossOutput(res.loss, {**res.metrics, "outside_kept_frac": frac}), logp, entropy


def two_pass_parts(call: LossCall):
    """The log-probs of `token_logprobs` (vocab-parallel with a process group), then the policy loss on them."""
    out = _logprobs(call, call.group, return_entropy=call.entropy_wanted)  # the sampler's fields stay off
    logp, entropy = out.logp, out.entropy
    return _loss(call, logp, entropy), logp, entropy


ROUTES = {
    "replay": sampled_parts,
    "sampled": sampled_parts,
    "vocab_parallel": two_pass_parts,
    "fused": fused_parts,
    "plain": two_pass_parts,
}


def run(call: LossCall):
    """(LossOutput, logp, entropy) of a checked call, on the path `route` picks."""
    path = route(call)
    if path in ("vocab_parallel", "fused", "plain") and _fp32_head(call.hidden, call.weight):
        # a float32 head (docs/math.md §8): one O(N·D) copy; d_hidden comes back in bf16
        call = dataclasses.replace(call, hidden=call.hidden.float())
    return ROUTES[path](call)


def _fp32_head(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    return weight.dtype == torch.float32 and hidden.dtype in (torch.float16, torch.bfloat16)
