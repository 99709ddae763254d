"""`FastRLGRPOTrainer`: TRL's `GRPOTrainer` with fastrl's log-probs and policy loss.

Everything TRL does around the loss stays TRL's: generation, rewards, advantages, batching, the reference
model, vLLM, logging. What changes:

- the policy, old and reference log-probs (and the entropy) come from `fastrl.token_logprobs` on the LM
  body's last hidden state (`head.add_fastrl_lm_head`), in the precision TRL's own kernel uses;
- the loss of each micro-batch is `fastrl.policy_loss` with `loss_config_from_trl(args)` and
  `trl_normalizer` (TRL's divisor for each `loss_type` under gradient accumulation, docs/math.md §3),
  the sampler's log-probs as `rollout_logprobs` for vLLM's importance sampling and the off-policy mask.

Logged metrics keep TRL's names and definitions. Options fastrl cannot honour raise at construction
(`options.check_args`).
"""

import torch
from trl import GRPOTrainer

from fastrl.hf import keep_attention_in_checkpoints
from fastrl.integrations.trl_compat import TRL_GLOBAL_TOKEN_TYPES, trl_normalizer
from fastrl.losses import policy_loss
from fastrl.losses.call import PolicyInputs
from fastrl.losses.route import fusable_loss

from .gather import zero3_params
from .head import IGNORE_INDEX, add_fastrl_lm_head, head_policy_loss
from .options import check_args, check_model, sampler_settings

__all__ = ["FastRLGRPOTrainer", "use_fastrl"]

_MULTIMODAL = (
    "pixel_values image_grid_thw num_images pixel_attention_mask spatial_shapes num_tiles image_sizes "
    "token_type_ids mm_token_type_ids image_position_ids"
).split()


def _patch_models(trainer, sampler_exact: bool = False, keep_attention_outputs: bool = True) -> None:
    from accelerate.utils import is_peft_model

    if not isinstance(sampler_exact, bool):
        raise TypeError(f"sampler_exact must be a bool, got {sampler_exact!r}")
    if not isinstance(keep_attention_outputs, bool):
        raise TypeError(f"keep_attention_outputs must be a bool, got {keep_attention_outputs!r}")
    config = check_args(trainer.args)
    check_model(trainer.model)
    head = dict(temperature=trainer.temperature, cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32,
                sampler=sampler_settings(trainer.args) if sampler_exact else None)  # fmt: skip
    model = trainer.model.get_base_model() if is_peft_model(trainer.model) else trainer.model
    add_fastrl_lm_head(model, **head)
    if keep_attention_outputs:
        keep_attention_in_checkpoints(model)
    if trainer.ref_model is not None:
        add_fastrl_lm_head(trainer.ref_model, **head)
    trainer._fastrl_loss, trainer._fastrl_head = config, head
    trainer._fastrl_head_module = model.get_output_embeddings()


class FastRLGRPOTrainer(GRPOTrainer):
    """`trl.GRPOTrainer` whose log-probs and policy loss are fastrl's; same constructor, same `GRPOConfig`.

    `sampler_exact=False` (default) reproduces TRL's loss, which scores the full softmax. `sampler_exact=True`
    scores the distribution the completions were sampled from: GRPOConfig's top_k / top_p / min_p truncate the
    policy, old and reference log-probs (and the entropy) as vLLM's sampler does (docs/math.md §8).
    `keep_attention_outputs=True` (default) makes TRL's non-reentrant gradient checkpointing keep each layer's
    attention kernel outputs (4·D bytes a token and layer) instead of running the kernel again in the backward.

    A training micro-batch whose loss the gradient-in-forward path takes (a token-level ratio, and no weight that
    reads the current log-probs: not GSPO's sequence level, CISPO, VESPO or the off-policy mask) has its loss and
    head gradients formed inside the model's forward (docs/math.md §7): three head GEMMs a token, not four.

    Raises:
        ValueError: a `GRPOConfig` option (or model) fastrl cannot honour, named, before the model is loaded.
    """

    def __init__(self, model, reward_funcs=None, args=None, *rest, sampler_exact: bool = False,
                 keep_attention_outputs: bool = True, **kwargs):  # fmt: skip
        if args is not None:
            check_args(args)
            if sampler_exact:
                sampler_settings(args)
        super().__init__(model, reward_funcs, args, *rest, **kwargs)
        _patch_models(self, sampler_exact, keep_attention_outputs)

    def _compute_loss(self, model, inputs):
        return _fastrl_compute_loss(self, model, inputs)

    def _fastrl_scored_loss(self, model, input_ids, attention_mask, logits_to_keep, loss):
        """`_get_per_token_logps_and_entropies` of a training micro-batch with its loss formed in the model's
        forward by `loss` (`_head_loss`): (logp `[B, logits_to_keep]`, entropy, LossOutput)."""
        with self.accelerator.autocast():
            out, logp, entropy = model(input_ids=input_ids, attention_mask=attention_mask, fused_lm_head=True,
                                       fastrl_loss=loss)  # fmt: skip
        return logp, entropy, out


def use_fastrl(
    trainer: GRPOTrainer, *, sampler_exact: bool = False, keep_attention_outputs: bool = True
) -> GRPOTrainer:
    """Switch an already built `GRPOTrainer` to fastrl's log-probs and loss, in place (before `train()`).

    `sampler_exact`, `keep_attention_outputs`: as for `FastRLGRPOTrainer` (default False: TRL's full-softmax
    loss; True).

    Raises:
        TypeError: not a `trl.GRPOTrainer`. ValueError: as `FastRLGRPOTrainer`.
    """
    if not isinstance(trainer, GRPOTrainer):
        raise TypeError(f"use_fastrl needs a trl.GRPOTrainer, got {type(trainer).__name__}")
    if isinstance(trainer, FastRLGRPOTrainer):
        return trainer
    _patch_models(trainer, sampler_exact, keep_attention_outputs)
    trainer.__class__ = type("FastRL" + type(trainer).__name__, (FastRLGRPOTrainer, type(trainer)), {})
    return trainer


def _fastrl_compute_loss(trainer, model, inputs):
    config = trainer._fastrl_loss
    completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
    input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
    mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
    mode = "train" if trainer.model.training else "eval"
    uses_rollout = config.is_cap is not None or config.off_policy_mask is not None
    uses_entropy = config.entropy_coef != 0 or config.top_entropy_quantile < 1
    normalizer = trl_normalizer(
        trainer.args, mask, num_items_in_batch=inputs.get("num_items_in_batch"),
        gradient_accumulation_steps=trainer.current_gradient_accumulation_steps,
        num_processes=trainer.accelerator.num_processes, training=mode == "train",
    )  # fmt: skip
    losses = dict(
        old=inputs.get("old_per_token_logps"), ref=inputs.get("ref_per_token_logps") if config.beta != 0 else None,
        rollout=inputs.get("sampling_per_token_logps") if uses_rollout else None, config=config, normalizer=normalizer,
    )  # fmt: skip
    if _loss_in_forward(trainer, inputs, losses):
        loss = _head_loss(trainer, completion_ids, mask, inputs["advantages"], losses)
        k = completion_ids.size(1)
        logp, entropies, out = trainer._fastrl_scored_loss(model, input_ids, attention_mask, k, loss)
    else:
        logp, entropies, _ = trainer._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True,
            **{key: inputs.get(key) for key in _MULTIMODAL},
        )  # fmt: skip
        out = policy_loss(
            logp, inputs["advantages"], mask, old_logprobs=losses["old"], ref_logprobs=losses["ref"],
            rollout_logprobs=losses["rollout"], entropy=entropies if uses_entropy else None, config=config,
            normalizer=normalizer,
        )  # fmt: skip
    _log_metrics(trainer, inputs, logp.detach(), entropies.detach(), mask, out, normalizer, mode)
    return out.loss


def _loss_in_forward(trainer, inputs, losses) -> bool:
    """The gradient-in-forward route (`head_policy_loss`) applies: a training forward under grad of a text model,
    TRL's full-softmax loss (no sampler truncation), a head that is not a ZeRO-3 parameter, and a loss
    `fusable_loss` takes (`head_policy_loss` checks again that a gradient is wanted)."""
    if not (torch.is_grad_enabled() and trainer.model.training) or trainer._fastrl_head["sampler"] is not None:
        return False
    if any(inputs.get(key) is not None for key in _MULTIMODAL):
        return False
    head = trainer._fastrl_head_module
    if zero3_params(head.weight, getattr(head, "bias", None)):
        return False
    return fusable_loss(losses["config"], losses["old"])


def _head_loss(trainer, completion_ids, mask, advantages, losses):
    """`fastrl_loss` for the patched forward: the policy loss of the completion on the body's last hidden state."""
    k = completion_ids.size(1)
    live = mask if mask.dtype == torch.bool else mask != 0
    targets = completion_ids.masked_fill(~live, IGNORE_INDEX)
    head = trainer._fastrl_head

    policy = PolicyInputs(advantages, mask, losses["old"], losses["ref"], losses["rollout"], losses["config"],
                          losses["normalizer"], "auto")  # fmt: skip

    def loss(module, hidden):  # hidden [B, P + K, D]: positions P - 1 … P + K - 2 predict the completion
        return head_policy_loss(module, hidden[:, -k - 1 : -1], targets, policy, temperature=head["temperature"],
                                cast_lm_head_to_fp32=head["cast_lm_head_to_fp32"])  # fmt: skip

    return loss


def _log_metrics(trainer, inputs, logp, entropies, mask, out, normalizer, mode):
    """TRL's `_compute_loss` metrics, under TRL's names and definitions, from the detached tensors."""
    from trl.trainer.utils import nanmax, nanmin

    config, metrics, gather = trainer._fastrl_loss, trainer._metrics[mode], trainer.accelerator.gather
    mask = mask.to(logp.dtype)
    accum = normalizer.accumulation_steps

    def global_mean(total, count):
        totals = trainer.accelerator.reduce(torch.stack([total, count.to(total.dtype)]), reduction="sum")
        return (totals[0] / totals[1].clamp(min=1.0)).item()

    def masked_mean(x):  # a [B, 1] (sequence-level) value counts once per sequence
        if x.shape[1] == 1:
            return global_mean(x.sum(), torch.tensor(float(x.shape[0]), device=x.device))
        return global_mean((x * mask).sum(), mask.sum())

    def seq_mean(x):
        return x.squeeze(1) if x.shape[1] == 1 else (x * mask).sum(-1) / mask.sum(-1)

    if config.entropy_coef != 0:
        # TRL logs the policy term alone (before its division for accumulation, except the global-token types)
        bonus = config.entropy_coef * _bonus_mean(trainer, entropies, mask)
        policy = (out.loss.detach() + bonus / accum) * (1 if trainer.loss_type in TRL_GLOBAL_TOKEN_TYPES else accum)
        metrics["policy_loss"].append(gather(policy).nanmean().item())
        if mode == "train" and trainer.accelerator.sync_gradients:
            metrics["entropy_coef"].append(trainer.entropy_coef)
    old = inputs.get("old_per_token_logps")
    log_ratio = logp - (logp if old is None else old)
    if config.ratio_level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    ratio = torch.exp(log_ratio)
    if config.beta != 0:
        # TRL's `kl` is the k3 term its loss adds: times the ratio under use_bias_correction_kl (off-policy
        # micro-batches then differ from the plain k3 that policy_loss reports as kl_mean)
        delta = inputs["ref_per_token_logps"] - logp
        kl = torch.exp(delta) - delta - 1
        metrics["kl"].append(masked_mean(kl * ratio if config.kl_bias_correction else kl))
    metrics["entropy"].append(masked_mean(entropies))
    advantages = inputs["advantages"]
    advantages = advantages if advantages.dim() == 2 else advantages.unsqueeze(1)
    if trainer.loss_type == "cispo":
        metrics["cispo_clip_ratio"].append(masked_mean(((ratio > trainer.epsilon_high) & (advantages > 0)).float()))
    elif trainer.loss_type == "vespo":
        args = trainer.args
        phi = trainer.get_gamma_weights(
            advantages, logp - (logp if old is None else old), mask, inputs.get("importance_sampling_ratio"),
            args.vespo_k_pos, args.vespo_lambda_pos, args.vespo_k_neg, args.vespo_lambda_neg,
        )  # fmt: skip
        metrics["vespo/phi_seq_mean"].append(masked_mean(phi))
    elif trainer.loss_type != "sapo":
        low = ((ratio < 1 - trainer.epsilon_low) & (advantages < 0)).float()
        high = ((ratio > 1 + trainer.epsilon_high) & (advantages > 0)).float()
        metrics["clip_ratio/low_mean"].append(masked_mean(low))
        metrics["clip_ratio/high_mean"].append(masked_mean(high))
        metrics["clip_ratio/region_mean"].append(masked_mean(torch.maximum(low, high)))
        metrics["clip_ratio/low_min"].append(nanmin(gather(seq_mean(low))).item())
        metrics["clip_ratio/high_max"].append(nanmax(gather(seq_mean(high))).item())


def _bonus_mean(trainer, entropies, mask):
    """The token-mean entropy TRL's bonus uses: over the high-entropy tokens when top_entropy_quantile < 1."""
    if trainer.top_entropy_quantile < 1.0:
        mask = mask * trainer.get_high_entropy_mask(entropies, mask, 1 - trainer.top_entropy_quantile)
    return (entropies * mask).sum() / mask.sum().clamp(min=1.0)
