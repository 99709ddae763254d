"""`FastRLGRPOTrainer`: TRL's `GRPOTrainer` with fastrl's log-probs and policy loss.

Everything TRL does around the loss stays TRL's: generation, rewards, advantages, batching, the reference
model, vLLM, logging. What changes:

- the policy, old and reference log-probs (and the entropy) come from `fastrl.token_logprobs` on the LM
  body's last hidden state (`head.add_fastrl_lm_head`), in the precision TRL's own kernel uses;
- the policy loss is `fastrl.policy_loss` with `options.loss_config(args)` and, per `loss_type`, the
  normalizer that gives TRL's loss over gradient accumulation (docs/math.md §3):

      grpo, dr_grpo, luspo   B · grad_accum          (per-sequence terms, mean over micro-batches)
      bnpo                   tokens of the micro-batch · grad_accum
      dapo                   the generation batch's token count, rescaled to one accumulation window

- TRL's per-token multipliers of the policy term (the off-policy sequence mask, the high-entropy token
  mask, vLLM's importance-sampling ratio) are non-negative constants, so they are folded into the
  advantages, which is exact (−min(r·wA, clip(r)·wA) = −w·min(r·A, clip(r)·A) for w ≥ 0);
- the entropy bonus keeps TRL's own aggregation (a token mean over the micro-batch, scaled for
  accumulation), outside the policy loss.

Logged metrics keep TRL's names and definitions. Options fastrl cannot honour raise at construction
(`options.check_args`).
"""

import torch
from trl import GRPOTrainer

from fastrl.losses import policy_loss

from .head import add_fastrl_lm_head
from .options import check_args, check_model, loss_config

__all__ = ["FastRLGRPOTrainer", "use_fastrl"]


def _patch_models(trainer) -> None:
    from accelerate.utils import is_peft_model

    args = trainer.args
    check_model(trainer.model)
    model = trainer.model.get_base_model() if is_peft_model(trainer.model) else trainer.model
    add_fastrl_lm_head(model, temperature=trainer.temperature, cast_lm_head_to_fp32=args.cast_lm_head_to_fp32)
    if trainer.ref_model is not None:
        add_fastrl_lm_head(
            trainer.ref_model, temperature=trainer.temperature, cast_lm_head_to_fp32=args.cast_lm_head_to_fp32
        )
    trainer._fastrl_loss = loss_config(args)


class FastRLGRPOTrainer(GRPOTrainer):
    """`trl.GRPOTrainer` whose log-probs and policy loss are fastrl's; same constructor, same `GRPOConfig`.

    Raises:
        ValueError: a `GRPOConfig` option (or model) fastrl cannot honour, named, before the model is loaded.
    """

    def __init__(self, model, reward_funcs=None, args=None, *rest, **kwargs):
        if args is not None:
            check_args(args)
        super().__init__(model, reward_funcs, args, *rest, **kwargs)
        _patch_models(self)

    def _compute_loss(self, model, inputs):
        return _fastrl_compute_loss(self, model, inputs)


def use_fastrl(trainer: GRPOTrainer) -> GRPOTrainer:
    """Switch an already built `GRPOTrainer` to fastrl's log-probs and loss, in place (before `train()`).

    Raises:
        ValueError: as `FastRLGRPOTrainer`.
    """
    if not isinstance(trainer, GRPOTrainer):
        raise TypeError(f"use_fastrl needs a trl.GRPOTrainer, got {type(trainer).__name__}")
    if isinstance(trainer, FastRLGRPOTrainer):
        return trainer
    check_args(trainer.args)
    _patch_models(trainer)
    trainer.__class__ = type("FastRL" + type(trainer).__name__, (FastRLGRPOTrainer, type(trainer)), {})
    return trainer


def _pg_advantages(trainer, inputs, per_token_logps, entropies, mask):
    """The advantages with TRL's per-token policy-term multipliers folded in: `[B]` or `[B, T]`."""
    advantages = inputs["advantages"]
    adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(1)
    factor = None
    if trainer.off_policy_mask_threshold is not None:
        old = inputs.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old
        sampling = inputs.get("sampling_per_token_logps", old)
        factor = trainer.get_off_policy_mask(adv, per_token_logps, sampling, mask, trainer.off_policy_mask_threshold)
    entropy_mask = None
    if trainer.top_entropy_quantile < 1.0:
        entropy_mask = trainer.get_high_entropy_mask(entropies, mask, 1 - trainer.top_entropy_quantile)
        factor = entropy_mask.to(adv.dtype) if factor is None else factor * entropy_mask
    if trainer.use_vllm and trainer.vllm_importance_sampling_correction:
        ratio = inputs["importance_sampling_ratio"]
        factor = ratio if factor is None else factor * ratio
    if factor is None:
        return advantages, entropy_mask
    return (adv * factor).expand(mask.shape).to(per_token_logps.dtype).contiguous(), entropy_mask


def _normalizer(trainer, inputs, mask, mode):
    accum = trainer.current_gradient_accumulation_steps if mode == "train" else 1
    if trainer.loss_type == "dapo":
        norm = inputs["num_items_in_batch"].clamp(min=1.0) / trainer.accelerator.num_processes
        return norm * accum / trainer.args.steps_per_generation if mode == "train" else norm
    if trainer.loss_type == "bnpo":
        return mask.sum().clamp(min=1) * accum
    return mask.shape[0] * accum


def _fastrl_compute_loss(trainer, model, inputs):
    prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
    completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
    multimodal = (
        "pixel_values image_grid_thw num_images pixel_attention_mask spatial_shapes num_tiles image_sizes "
        "token_type_ids mm_token_type_ids image_position_ids"
    )
    per_token_logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
        model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True,
        **{key: inputs.get(key) for key in multimodal.split()},
    )  # fmt: skip
    mode = "train" if trainer.model.training else "eval"
    advantages, entropy_mask = _pg_advantages(trainer, inputs, per_token_logps, entropies, mask)
    old = inputs.get("old_per_token_logps")
    ref = inputs.get("ref_per_token_logps") if trainer.beta != 0.0 else None
    out = policy_loss(
        per_token_logps, advantages, mask, old_logprobs=old, ref_logprobs=ref, config=trainer._fastrl_loss,
        normalizer=_normalizer(trainer, inputs, mask, mode),
    )  # fmt: skip
    loss = out.loss
    if trainer._entropy_bonus_enabled:
        accum = trainer.current_gradient_accumulation_steps if mode == "train" else 1
        scale = 1 if trainer.loss_type == "dapo" else accum
        trainer._metrics[mode]["policy_loss"].append(trainer.accelerator.gather(loss.detach() * scale).nanmean().item())
        loss = loss - _entropy_bonus(trainer, entropies, mask if entropy_mask is None else mask * entropy_mask, mode)
    _log_metrics(trainer, inputs, per_token_logps.detach(), entropies.detach(), mask, out.metrics, mode)
    return loss


def _entropy_bonus(trainer, entropies, mask, mode):
    """TRL's bonus: coef · (token-mean entropy of the micro-batch) / grad_accum, with its adaptive coefficient."""
    accum = trainer.current_gradient_accumulation_steps if mode == "train" else 1
    mean_entropy = (entropies * mask).sum() / mask.sum().clamp(min=1.0) / accum
    if trainer.use_adaptive_entropy:
        coef = trainer.entropy_coef if trainer._last_world_entropy <= trainer.args.entropy_target else 0.0
    else:
        coef = trainer.entropy_coef
    if trainer.use_adaptive_entropy and mode == "train":
        stats = torch.stack([(entropies * mask).sum(), mask.sum()]).detach()
        window = trainer._entropy_window_stats
        trainer._entropy_window_stats = stats if window is None else window + stats
        if trainer.accelerator.sync_gradients:
            totals = trainer.accelerator.reduce(trainer._entropy_window_stats, reduction="sum")
            world = (totals[0] / totals[1].clamp(min=1.0)).item()
            args = trainer.args
            if world <= args.entropy_target:
                trainer.entropy_coef = min(trainer.entropy_coef + args.entropy_coef_delta, args.entropy_coef_max)
            else:
                trainer.entropy_coef = max(trainer.entropy_coef - args.entropy_coef_delta, args.entropy_coef_min)
            trainer._last_world_entropy = world
            trainer._entropy_window_stats = None
    if mode == "train" and trainer.accelerator.sync_gradients:
        trainer._metrics[mode]["entropy_coef"].append(trainer.entropy_coef)
    return coef * mean_entropy


def _log_metrics(trainer, inputs, logp, entropies, mask, fastrl_metrics, mode):
    """TRL's `_compute_loss` metrics, under TRL's names, from the detached log-probs."""
    from trl.trainer.utils import nanmax, nanmin

    metrics = trainer._metrics[mode]
    mask = mask.to(logp.dtype)
    sequence = trainer.importance_sampling_level == "sequence"

    def global_mean(total, count):
        totals = trainer.accelerator.reduce(torch.stack([total, count.to(total.dtype)]), reduction="sum")
        return (totals[0] / totals[1].clamp(min=1.0)).item()

    def masked_mean(x):  # a [B, 1] (sequence-level) value counts once per sequence
        if x.shape[1] == 1:
            return global_mean(x.sum(), torch.tensor(float(x.shape[0]), device=x.device))
        return global_mean((x * mask).sum(), mask.sum())

    def seq_mean(x):
        return x.squeeze(1) if x.shape[1] == 1 else (x * mask).sum(-1) / mask.sum(-1)

    if trainer.beta != 0.0:
        tokens = fastrl_metrics["num_tokens"]
        metrics["kl"].append(global_mean(fastrl_metrics["kl_mean"] * tokens, tokens))
    metrics["entropy"].append(masked_mean(entropies))
    old = inputs.get("old_per_token_logps")
    log_ratio = logp - (logp if old is None else old)
    if sequence:
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    ratio = torch.exp(log_ratio)
    advantages = inputs["advantages"]
    advantages = advantages if advantages.dim() == 2 else advantages.unsqueeze(1)
    low = ((ratio < 1 - trainer.epsilon_low) & (advantages < 0)).float()
    high = ((ratio > 1 + trainer.epsilon_high) & (advantages > 0)).float()
    metrics["clip_ratio/low_mean"].append(masked_mean(low))
    metrics["clip_ratio/high_mean"].append(masked_mean(high))
    metrics["clip_ratio/region_mean"].append(masked_mean(torch.maximum(low, high)))
    metrics["clip_ratio/low_min"].append(nanmin(trainer.accelerator.gather(seq_mean(low))).item())
    metrics["clip_ratio/high_max"].append(nanmax(trainer.accelerator.gather(seq_mean(high))).item())
