"""`grpo_loss` with its gradient formed in the forward pass (docs/math.md §6): the loss side of the glue.

Taken for a token-level ratio when a gradient is wanted. The loss value and the metrics are those of
`policy_loss` on the log-probs of the same pass (so they equal the two-pass path's); the gradients of
hidden, weight and bias come from `fastrl.kernels.fused_loss`, formed chunk by chunk in the forward and
handed to autograd by the backward.
"""

import torch

from fastrl.kernels import attach_gradients, policy_loss_grads

from .config import LossConfig
from .policy import LossOutput, _aggregate, _kernel_params, policy_loss

__all__ = ["fused_grpo_loss", "wants_fused"]


def wants_fused(hidden, weight, bias, config: LossConfig) -> bool:
    """True when the gradient-in-forward path applies: a token-level ratio and a gradient to form."""
    if config.ratio_level != "token" or not torch.is_grad_enabled():
        return False
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in (hidden, weight, bias))


def _row_weight(mask: torch.Tensor, config: LossConfig, normalizer) -> torch.Tensor:
    # ∂L/∂row_loss_b of the aggregation (linear in row_loss), from the aggregation itself
    live = mask if mask.dtype == torch.bool else mask != 0
    tokens = live.sum(-1).float()
    probe = torch.zeros(mask.shape[0], dtype=torch.float32, device=mask.device, requires_grad=True)
    with torch.enable_grad():
        (weight,) = torch.autograd.grad(_aggregate(probe, tokens, config, normalizer), probe)
    return weight


def fused_grpo_loss(
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
) -> LossOutput:
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
    logp, entropy, grads = policy_loss_grads(
        hidden,
        weight,
        targets,
        advantages,
        mask,
        old,
        ref,
        rollout,
        _kernel_params(config),
        _row_weight(mask, config, normalizer),
        bias=bias,
        temperature=temperature,
        ignore_index=ignore_index,
        entropy=need_entropy,
        impl=impl,
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
    return LossOutput(attach_gradients(out.loss.detach(), hidden, weight, bias, grads), out.metrics)
