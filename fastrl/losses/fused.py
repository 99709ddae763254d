"""The loss paths `route.run` picks, each taking the one checked `LossCall` and returning (LossOutput, logp, entropy):

    fused_parts     the gradient-in-forward pass (docs/math.md §7): the gradients of hidden, weight and bias formed
                    chunk by chunk in the forward (`fastrl.kernels.fused_loss`), handed to autograd by the backward
    sampled_parts   the sampler's distribution (§8) or its replayed kept sets (§9), which that pass cannot take
    two_pass_parts  the log-probs (and entropy) of `token_logprobs`, then the policy loss on them (the plain and the
                    vocab-parallel head; a loss whose weights read the current log-probs)

Each computes the loss value and the metrics with `policy_loss_of` on its own log-probs, so every path's loss equals
the two-pass composition `token_logprobs` → `policy_loss`.
"""

import torch

from fastrl.kernels import attach_gradients, policy_loss_grads, sampled_token_logprobs, token_logprobs

from .call import LossCall
from .policy import LossOutput, Normalizer, aggregate, check_live_finite, kernel_params, policy_loss_of
from .weights import policy_weight

__all__ = ["fused_parts", "sampled_parts", "two_pass_parts"]


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


def fused_parts(call: LossCall):
    """The loss with its gradients formed in the vocabulary pass; logp and entropy come back detached."""
    p, config = call.policy, call.config
    need_entropy = config.entropy_coef != 0 or call.return_entropy
    adv = p.advantages if p.advantages.dim() == 2 else p.advantages.unsqueeze(-1)
    # the policy term's detached factor (here only an IS weight from old and rollout log-probs: see
    # `route.fusable_loss`) is known before the pass; zeros stand in for the current logp it does not read
    zeros = torch.zeros(p.mask.shape, dtype=torch.float32, device=call.hidden.device)
    token_weight, _, _ = policy_weight(config, zeros, p.old, p.rollout, p.live, adv, None)
    policy_normalizer = p.normalizer.policy if isinstance(p.normalizer, Normalizer) else p.normalizer
    logp, entropy, grads = policy_loss_grads(
        call.hidden,
        call.weight,
        call.targets,
        p.advantages,
        p.mask,
        p.old,
        p.ref,
        None if token_weight is None else token_weight.float(),
        kernel_params(config),
        _row_weight(p.mask, config, policy_normalizer),
        entropy=need_entropy,
        **call.logprob_options(),
    )
    out = _loss(call, logp, entropy)
    loss = attach_gradients(out.loss.detach(), call.hidden, call.weight, call.bias, grads)
    return LossOutput(loss, out.metrics), logp, entropy


def sampled_parts(call: LossCall):
    """The loss on the sampler's distribution: its log-probs (two passes, no gradient-in-forward), then the policy
    loss; metrics["outside_kept_frac"] added. With kept sets, a live token whose target is outside its set is a
    ValueError naming it; with a process group the vocab-parallel op takes the soft-cap (and refuses truncation)."""
    need_entropy = call.entropy_wanted
    options = dict(call.logprob_options(), return_entropy=need_entropy, softcap=call.config.softcap, **call.sampler)
    if call.kept is not None:
        options.update(kept_ids=call.kept[0], kept_offsets=call.kept[1])
    if call.group is None:
        out = sampled_token_logprobs(call.hidden, call.weight, call.targets, **options)
        logp, entropy, outside = out.logp, out.entropy, out.outside
        if call.kept is not None and bool(outside.any()):
            b, t = (int(x) for x in torch.nonzero(outside)[0])
            raise ValueError(
                f"the target at position ({b}, {t}) is not in its kept set (the sampler never kept it): set mask "
                "to 0 there to leave it out"
            )
    else:
        out = token_logprobs(call.hidden, call.weight, call.targets, process_group=call.group, **options)
        logp, entropy = out if need_entropy else (out, None)
        outside = torch.zeros(logp.shape, dtype=torch.bool, device=logp.device)  # nothing truncated
    res = _loss(call, logp, entropy)
    live = call.policy.live
    frac = (outside & live).sum().float() / live.sum().clamp(min=1).float()
    return LossOutput(res.loss, {**res.metrics, "outside_kept_frac": frac}), logp, entropy


def two_pass_parts(call: LossCall):
    """The log-probs of `token_logprobs` (vocab-parallel with a process group), then the policy loss on them."""
    need_entropy = call.entropy_wanted
    out = token_logprobs(
        call.hidden, call.weight, call.targets, return_entropy=need_entropy, process_group=call.group,
        **call.logprob_options(),
    )  # fmt: skip
    logp, entropy = out if need_entropy else (out, None)
    return _loss(call, logp, entropy), logp, entropy
