"""fastrl inside verl's actor (needs verl): a registered policy loss and the fused log-prob backend.

Importing this module (verl's workers do it through the model's `external_lib` option)

- registers `fastrl_policy_loss` in verl's policy-loss registry under "fastrl";
- makes `forward_with_fastrl_backend` the forward verl installs on dense text models when
  `use_fused_kernels=True` (either `fused_kernel_options.impl_backend`): the actor's log-probs and entropy then
  come from `fastrl.token_logprobs` on the body's hidden states, never building `[tokens, V]`.

    actor_rollout_ref.model.external_lib=fastrl.integrations.verl
    actor_rollout_ref.actor.policy_loss.loss_mode=fastrl
    actor_rollout_ref.model.use_fused_kernels=True

The forward serves the training pass and the old/ref passes (under `no_grad`) alike. It takes verl's
`shift_labels` verbatim (the engine rolled them over the whole packed sequence before slicing it for Ulysses
sequence parallelism); `log_probs` and `entropy` (never None) have the labels' shape, `(1, total_nnz)` with
remove-padding. Under verl's FSDP2 engine a tied head is read inside the root unit's gathered forward; an
untied `lm_head`, which verl wraps as its own FSDP unit, is run through that unit (`_head_unit`): gathered
once per forward and once for its backward, never per vocabulary chunk (docs/integrations.md, "verl").

It is verl's "vanilla" PPO policy term (clip-higher `clip_ratio_low` / `clip_ratio_high`, the dual clip
`clip_ratio_c`, the rollout importance weights), aggregated by `loss_agg_mode` with verl's global batch
normalizers (docs/math.md §2–3); verl adds the KL and entropy terms itself, as for every loss mode. The
rollout weights are non-negative constants on the policy term, so they are folded into the advantages
(exact). verl clamps the log-ratio to [−20, 20] before `exp`; fastrl does not, which changes nothing unless a
ratio exceeds e^20.
"""

import types

import torch
from verl.trainer.ppo.core_algos import register_policy_loss

from fastrl.hf import lm_body_and_head
from fastrl.kernels import token_logprobs
from fastrl.losses import LossConfig, policy_loss

from .verl_compat import loss_config_from_verl, verl_normalizer

__all__ = [
    "VERL_FORWARDS",
    "fastrl_policy_loss",
    "forward_with_fastrl_backend",
    "policy_term_config",
    "use_fastrl_backend",
]


# the actor fields of verl's "vanilla" policy term; verl adds the KL and entropy terms outside it
_POLICY_FIELDS = (
    "clip_ratio",
    "clip_ratio_low",
    "clip_ratio_high",
    "clip_ratio_c",
    "loss_agg_mode",
    "loss_scale_factor",
)


def _get(config, name, default=None):
    value = config.get(name, default) if hasattr(config, "get") else getattr(config, name, default)
    return default if value is None else value


def policy_term_config(actor, loss_agg_mode: str) -> LossConfig:
    """`loss_config_from_verl` of verl's "vanilla" policy term for this actor config (no KL, no entropy)."""
    fields = {name: _get(actor, name) for name in _POLICY_FIELDS}
    fields.update(loss_agg_mode=loss_agg_mode, policy_loss={"loss_mode": "vanilla"})
    return loss_config_from_verl({k: v for k, v in fields.items() if v is not None})


@register_policy_loss("fastrl")
def fastrl_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
):
    """verl's policy-loss signature: `[B, T]` tensors → (pg_loss, {"actor/pg_clipfrac", "actor/ppo_kl",
    "actor/pg_clipfrac_lower"}), with verl's metric definitions."""
    if config is None:
        raise ValueError("fastrl_policy_loss needs verl's actor config (clip_ratio, global_batch_info, ...)")
    loss_config = policy_term_config(config, loss_agg_mode)
    info = dict(_get(config, "global_batch_info", {}))
    normalizer = verl_normalizer(
        loss_config, dp_size=int(info.get("dp_size") or 1), batch_num_tokens=info.get("batch_num_tokens"),
        global_batch_size=info.get("global_batch_size"),
    )  # fmt: skip
    pg_advantages = advantages if rollout_is_weights is None else advantages * rollout_is_weights
    out = policy_loss(
        log_prob, pg_advantages, response_mask, old_logprobs=old_log_prob, config=loss_config, normalizer=normalizer
    )
    mask = response_mask.to(log_prob.dtype)
    tokens = mask.sum().clamp(min=1)
    log_ratio = (log_prob.detach() - old_log_prob).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    clipped = -advantages * ratio.clamp(1 - loss_config.eps_low, 1 + loss_config.eps_high)
    low = (ratio < 1 - loss_config.eps_low) & (advantages < 0)
    high = (ratio > 1 + loss_config.eps_high) & (advantages > 0)
    capped = (torch.maximum(-advantages * ratio, clipped) > -advantages * loss_config.dual_clip) & (advantages < 0)

    def mean(x):
        return ((x.to(mask.dtype) * mask).sum() / tokens).item()

    metrics = {
        "actor/pg_clipfrac": mean(low | high),
        "actor/ppo_kl": mean(-log_ratio),
        "actor/pg_clipfrac_lower": mean(capped),
    }
    return out.loss, metrics


def forward_with_fastrl_backend(
    self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, inputs_embeds=None,
    labels=None, use_cache=None, output_attentions=None, output_hidden_states=None, return_dict=None,
    cache_position=None, logits_to_keep=0, temperature=1.0, shift_labels=None, **loss_kwargs,
):  # fmt: skip
    """verl's fused-kernel forward of a dense causal LM, with fastrl's log-probs: returns verl's
    `CausalLMOutputForPPO` (log_probs float32, entropy in the hidden states' dtype, as verl's backends)."""
    from verl.models.transformers.dense_common import CausalLMOutputForPPO, forward_base_model

    outputs = forward_base_model(
        self, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
        past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
        output_attentions=output_attentions, output_hidden_states=output_hidden_states, return_dict=return_dict,
        cache_position=cache_position,
    )  # fmt: skip
    if shift_labels is not None:  # labels verl has already rolled (sequence parallelism)
        targets = shift_labels
    elif labels is not None:
        targets = torch.roll(labels, shifts=-1, dims=-1)
    elif input_ids is not None:
        targets = torch.roll(input_ids, shifts=-1, dims=-1)
    else:
        raise ValueError("forward_with_fastrl_backend needs labels, shift_labels or input_ids")
    hidden = outputs[0]
    args = (self, hidden, targets.to(torch.int64), float(temperature))
    head = _head_unit(self)
    logp, entropy = _head_logprobs(*args) if head is None else head.fastrl_head_call(_head_logprobs, *args)
    return CausalLMOutputForPPO(
        log_probs=logp, entropy=entropy.to(hidden.dtype), past_key_values=outputs.past_key_values,
        hidden_states=outputs.hidden_states, attentions=outputs.attentions,
    )  # fmt: skip


def _head_logprobs(model, hidden, targets, temperature):
    """Log-probs and entropy of `targets` from the head's weight as it is NOW (gathered, under FSDP)."""
    _, weight, bias = lm_body_and_head(model)
    return token_logprobs(hidden, weight, targets, bias=bias, temperature=temperature, return_entropy=True)


def _call(self, fn, *args):
    return fn(*args)


def _head_unit(model):
    """The LM head when it is an FSDP2 unit of its own (verl's FSDP2 engine wraps an untied `lm_head` so),
    with `fastrl_head_call` registered as one of its FSDP forward methods; None otherwise.

    The fused log-probs read the head's weight without calling the head, so FSDP2 would never all-gather
    it (the weight stays a DTensor shard) nor reduce-scatter its gradient. `head.fastrl_head_call(fn, ...)`
    runs `fn` the way the head's own forward runs: the weight all-gathered before it, resharded after,
    gathered again for the backward and its gradient reduce-scattered (accumulated unsharded under
    gradient accumulation), exactly as the logits path would see it. A head wrapped as its own FSDP1
    unit has no such hook and is refused.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or head is model or not torch.distributed.is_available():
        return None
    from torch.distributed import fsdp

    if isinstance(head, fsdp.FullyShardedDataParallel):
        raise ValueError(
            f"{type(model).__name__}'s LM head is an FSDP1 unit of its own (FullyShardedDataParallel): its weight "
            "is not gathered outside its forward; use verl's FSDP2 engine (actor.strategy=fsdp2) or keep the head "
            "in the root unit"
        )
    if not isinstance(head, getattr(fsdp, "FSDPModule", ())):
        return None
    if not hasattr(head, "fastrl_head_call"):
        head.fastrl_head_call = types.MethodType(_call, head)
        fsdp.register_fsdp_forward_method(head, "fastrl_head_call")
    return head


# verl's own fused forwards, as they were before `use_fastrl_backend` replaced them
VERL_FORWARDS = {}


def use_fastrl_backend() -> None:
    """Make verl's `use_fused_kernels` path install `forward_with_fastrl_backend` on dense text models."""
    import verl.models.transformers.dense_common as dense

    if not VERL_FORWARDS:
        VERL_FORWARDS.update(torch=dense.forward_with_torch_backend, triton=dense.forward_with_triton_backend)
    dense.forward_with_torch_backend = forward_with_fastrl_backend
    dense.forward_with_triton_backend = forward_with_fastrl_backend


use_fastrl_backend()
