"""The one router of the loss: which path a checked `LossCall` runs (docs/math.md §7–9).

replay          kept_ids / kept_offsets given: softmax over the sampler's own kept sets (fused.sampled_parts)
sampled         a truncation rule or a soft-cap on: the sampler's distribution (fused.sampled_parts)
vocab_parallel  a process group: the head's rows split over the ranks (fused.two_pass_parts)
fused           a token-level loss and a gradient to form: gradient-in-forward (fused.fused_parts)
plain           otherwise: log-probs, then the policy loss (fused.two_pass_parts)
"""

import dataclasses

import torch

from fastrl.kernels import sampler_on

from .call import LossCall
from .config import LossConfig
from .fused import fused_parts, sampled_parts, two_pass_parts

__all__ = ["ROUTES", "fusable_loss", "route", "run", "wants_fused"]


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
