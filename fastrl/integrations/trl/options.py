"""What `FastRLGRPOTrainer` does with every `GRPOConfig` field, and the `LossConfig` it builds from them.

Each field `GRPOConfig` adds to `transformers.TrainingArguments` is in `FIELDS`, under one of:

    "fastrl"  read by the integration: it changes the log-probs or the loss fastrl computes
    "trl"     acted on by TRL's own code, which the subclass keeps (generation, rewards, advantages,
              batching, vLLM, logging); the log-probs it needs come through fastrl's head
    "refused" the integration raises at construction when the field asks for something fastrl does not
              compute, naming the field (`check_args`); at its default it is inert

`loss_config_from_trl` reads the "fastrl" fields and raises for the settings it does not reproduce.

`TrainingArguments` fields go to `transformers.Trainer` unchanged, except `bf16` / `fp16`, whose autocast
dtype the head honours as TRL's kernel does. A field missing from `FIELDS` (a newer TRL) is refused, so no
option is ignored silently.
"""

import dataclasses

from fastrl.integrations.trl_compat import loss_config_from_trl
from fastrl.losses import LossConfig

__all__ = ["FIELDS", "check_args", "check_model", "sampler_settings"]

_FASTRL = (
    "loss_type epsilon epsilon_high delta beta use_bias_correction_kl importance_sampling_level temperature "
    "max_completion_length top_entropy_quantile entropy_coef off_policy_mask_threshold cast_lm_head_to_fp32 "
    "sapo_temperature_neg sapo_temperature_pos vespo_k_pos vespo_lambda_pos vespo_k_neg vespo_lambda_neg "
    "vllm_importance_sampling_correction vllm_importance_sampling_mode vllm_importance_sampling_clip_max "
    "vllm_importance_sampling_clip_min"
)
# refused when set: use_adaptive_entropy=True (the entropy_coef_* fields only act with it), an MoE aux loss
_REFUSED = (
    "router_aux_loss_coef use_adaptive_entropy entropy_coef_min entropy_coef_max entropy_coef_delta entropy_target"
)
_TRL = (
    "model_init_kwargs trust_remote_code disable_dropout num_generations num_generations_eval "
    "ds3_gather_for_generation shuffle_dataset pad_to_multiple_of generation_batch_size steps_per_generation "
    "top_p top_k min_p generation_kwargs chat_template_kwargs repetition_penalty cache_implementation use_vllm "
    "vllm_mode vllm_model_impl vllm_enable_sleep_mode vllm_structured_outputs_regex vllm_server_base_url "
    "vllm_server_host vllm_server_port vllm_server_timeout vllm_group_port vllm_gpu_memory_utilization "
    "vllm_max_model_length vllm_tensor_parallel_size num_iterations reward_weights multi_objective_aggregation "
    "scale_rewards mask_truncated_completions sync_ref_model ref_model_mixup_alpha ref_model_sync_steps "
    "max_tool_calling_iterations vllm_importance_sampling_cap log_completions log_multimodal "
    "num_completions_to_print log_unique_prompts log_completions_hub_repo use_transformers_continuous_batching "
    "transformers_continuous_batching_config use_transformers_paged"
)
FIELDS = {
    **{name: "fastrl" for name in _FASTRL.split()},
    **{name: "refused" for name in _REFUSED.split()},
    **{name: "trl" for name in _TRL.split()},
}


def _own_fields(args) -> list[str]:
    from transformers import TrainingArguments

    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    return [f.name for f in dataclasses.fields(args) if f.name not in base]


def check_args(args) -> LossConfig:
    """The `LossConfig` of TRL's loss for `args` (`loss_config_from_trl`), or a ValueError naming every
    `GRPOConfig` option fastrl cannot honour exactly."""
    unknown = [name for name in _own_fields(args) if name not in FIELDS]
    if unknown:
        raise ValueError(f"GRPOConfig field(s) {unknown} are not known to FastRLGRPOTrainer; refusing to ignore them")
    if args.router_aux_loss_coef:
        raise ValueError(
            f"router_aux_loss_coef={args.router_aux_loss_coef}: the MoE load-balancing loss is not supported"
        )
    return loss_config_from_trl(args)


def sampler_settings(args) -> dict:
    """`GRPOConfig`'s top_k / top_p / min_p as `token_logprobs` keywords, for `sampler_exact=True`: the loss then
    scores the distribution the completions were drawn from (docs/math.md §8), not TRL's full softmax."""
    kwargs = args.generation_kwargs or {}
    if isinstance(kwargs, dict) and {"top_k", "top_p", "min_p", "temperature"} & set(kwargs):
        raise ValueError(f"sampler_exact=True reads top_k / top_p / min_p from GRPOConfig; generation_kwargs={kwargs} "
                         "overrides them: set them as GRPOConfig fields")  # fmt: skip
    if args.min_p and args.top_p < 1 and not args.use_vllm:
        # transformers' generate applies min-p after top-p; vLLM (whose order the log-probs follow) before it
        raise ValueError(f"sampler_exact=True with min_p={args.min_p} and top_p={args.top_p} needs use_vllm=True: "
                         "transformers samples min-p after top-p")  # fmt: skip
    return {"top_k": args.top_k or None, "top_p": args.top_p, "min_p": args.min_p}


def check_model(model) -> None:
    """Raise ValueError when the model asks for a loss term fastrl's head does not compute."""
    text_config = model.config.get_text_config()
    if hasattr(text_config, "output_router_logits") and getattr(text_config, "router_aux_loss_coef", 0.0) != 0.0:
        raise ValueError(
            f"{type(model).__name__} is a Mixture-of-Experts model with router_aux_loss_coef="
            f"{text_config.router_aux_loss_coef}: its load-balancing loss is not supported (set the config's "
            "router_aux_loss_coef, or GRPOConfig.router_aux_loss_coef, to 0.0)"
        )
