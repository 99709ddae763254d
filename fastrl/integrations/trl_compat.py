"""TRL's `GRPOTrainer` loss as a `LossConfig`, and the normalizer of one of its micro-batch calls.

fastrl's knowledge of TRL (its loss types, IS modes and divisors), with no TRL import: `loss_config_from_trl`
and `trl_normalizer` serve a caller of `policy_loss` without TRL's trainer, and `fastrl.integrations.trl` reads
them (and the one table of TRL's loss types, `TRL_LOSS_TYPES`) from here.
"""

from typing import NamedTuple

import torch

from fastrl.losses import LossConfig, Normalizer

__all__ = [
    "TRL_GLOBAL_TOKEN_TYPES",
    "TRL_IS_MODES",
    "TRL_LOSS_TYPES",
    "TRLLossType",
    "loss_config_from_trl",
    "trl_normalizer",
]


class TRLLossType(NamedTuple):
    loss_agg: str  # docs/math.md §3 aggregation
    pg_loss: str  # policy term
    global_tokens: bool  # divided by the generation batch's token count (`num_items_in_batch`), not the call's


# TRL's `loss_type` names: the one table (the TRL integration and the tests read it)
TRL_LOSS_TYPES = {
    "grpo": TRLLossType("seq-mean-token-mean", "clip", False),
    "bnpo": TRLLossType("token-mean", "clip", False),
    "dr_grpo": TRLLossType("seq-mean-token-sum-norm", "clip", False),
    "dapo": TRLLossType("token-mean", "clip", True),
    "luspo": TRLLossType("seq-mean-token-sum", "clip", False),
    "cispo": TRLLossType("token-mean", "cispo", True),
    "sapo": TRLLossType("seq-mean-token-mean", "sapo", False),
    "vespo": TRLLossType("token-mean", "vespo", True),
}
TRL_GLOBAL_TOKEN_TYPES = tuple(name for name, kind in TRL_LOSS_TYPES.items() if kind.global_tokens)
TRL_IS_MODES = {
    "token_truncate": ("token", "truncate"),
    "token_mask": ("token", "mask"),
    "sequence_truncate": ("sequence", "truncate"),
    "sequence_mask": ("sequence", "mask"),
}


def _get(args, name, default=None):
    return getattr(args, name, default)


def loss_config_from_trl(args) -> LossConfig:
    """The config whose loss equals TRL's `GRPOTrainer` loss for `args` (a `trl.GRPOConfig`, or any object with
    its field names).

    Raises:
        ValueError: naming every option of `args` that fastrl does not reproduce (an unknown `loss_type` or
            `vllm_importance_sampling_mode` on its own).
    """
    unsupported = []
    loss_type = _get(args, "loss_type", "dapo")
    if loss_type not in TRL_LOSS_TYPES:
        raise ValueError(f"loss_type={loss_type!r} is not one of TRL's {tuple(TRL_LOSS_TYPES)}")
    if _get(args, "use_liger_kernel", False):
        unsupported.append("use_liger_kernel=True (TRL then runs Liger's loss, not GRPOTrainer's)")
    if _get(args, "use_adaptive_entropy", False):
        unsupported.append("use_adaptive_entropy=True (the entropy coefficient changes between steps)")
    agg, pg, _ = TRL_LOSS_TYPES[loss_type]
    eps = float(_get(args, "epsilon", 0.2))
    eps_high = _get(args, "epsilon_high", None)
    eps_high = eps if eps_high is None else float(eps_high)
    fields = dict(loss_agg=agg, pg_loss=pg, eps_low=eps, eps_high=eps_high)
    if pg == "cispo":
        # TRL's CISPO weight is min(r, epsilon_high): no lower bound, an absolute upper one
        fields.update(eps_low=1.0, eps_high=eps_high - 1.0)
    delta = _get(args, "delta", None)
    if delta is not None and pg == "clip":
        if not delta >= 1 + eps_high:
            unsupported.append(f"delta={delta} < 1 + epsilon_high (it then also caps the A > 0 ratio)")
        else:
            fields["dual_clip"] = float(delta)
    beta = float(_get(args, "beta", 0.0))
    fields.update(beta=beta, kl="k3", kl_bias_correction=bool(_get(args, "use_bias_correction_kl", False)))
    fields.update(entropy_coef=float(_get(args, "entropy_coef", 0.0)), entropy_agg="token-mean")
    fields.update(temperature=float(_get(args, "temperature", 1.0)))
    fields.update(ratio_level=_get(args, "importance_sampling_level", "token"))
    fields.update(max_completion_length=_get(args, "max_completion_length", None))
    if _get(args, "use_vllm", False) and _get(args, "vllm_importance_sampling_correction", False):
        mode = _get(args, "vllm_importance_sampling_mode", "sequence_mask")
        if mode not in TRL_IS_MODES:
            raise ValueError(f"vllm_importance_sampling_mode={mode!r} is not one of {tuple(TRL_IS_MODES)}")
        level, kind = TRL_IS_MODES[mode]
        cap, low = _get(args, "vllm_importance_sampling_clip_max", 3.0), _get(args, "vllm_importance_sampling_clip_min")
        if cap is None:
            unsupported.append("vllm_importance_sampling_clip_max=None (fastrl's IS weight needs an upper bound)")
        else:
            fields.update(is_level=level, is_mode=kind, is_cap=float(cap))
            fields.update(is_min=None if low is None else float(low))
    threshold = _get(args, "off_policy_mask_threshold", None)
    fields.update(off_policy_mask=None if threshold is None else float(threshold))
    fields.update(top_entropy_quantile=float(_get(args, "top_entropy_quantile", 1.0)))
    # TRL picks the SAPO temperatures with torch.where on Python floats: float32 values
    for side, default in (("pos", 1.0), ("neg", 1.05)):
        tau = float(_get(args, f"sapo_temperature_{side}", default))
        fields[f"sapo_tau_{side}"] = torch.tensor(tau, dtype=torch.float32).item()
    # so does VESPO's k and λ
    for name, default in (("k_pos", 2.0), ("lambda_pos", 3.0), ("k_neg", 3.0), ("lambda_neg", 2.0)):
        value = float(_get(args, f"vespo_{name}", default))
        fields[f"vespo_{name}"] = torch.tensor(value, dtype=torch.float32).item()
    if unsupported:
        raise ValueError("fastrl does not reproduce these TRL settings: " + "; ".join(unsupported))
    return LossConfig(**fields)


def trl_normalizer(
    args,
    mask: torch.Tensor,
    *,
    num_items_in_batch=None,
    gradient_accumulation_steps: int | None = None,
    num_processes: int = 1,
    training: bool = True,
) -> Normalizer:
    """The `normalizer=` that makes one micro-batch call equal TRL's `compute_loss` on it.

    Args:
        args: the `trl.GRPOConfig` the config came from (`loss_config_from_trl(args)`).
        mask: this micro-batch's `[B, T]` completion mask.
        num_items_in_batch: the generation batch's token count TRL passes to `compute_loss`
            (needed by loss_type dapo / cispo / vespo).
        gradient_accumulation_steps: the trainer's `current_gradient_accumulation_steps` (default
            `args.gradient_accumulation_steps`).
        num_processes: `accelerator.num_processes` (data-parallel ranks average their gradients).
        training: False for an evaluation call (no accumulation).
    """
    loss_type = getattr(args, "loss_type", "dapo")
    if num_processes > 1 and getattr(args, "top_entropy_quantile", 1.0) < 1:
        raise ValueError(
            f"top_entropy_quantile={args.top_entropy_quantile} with num_processes={num_processes}: TRL takes the "
            "entropy quantile over all processes' tokens, fastrl over this call's"
        )
    ga = args.gradient_accumulation_steps if gradient_accumulation_steps is None else gradient_accumulation_steps
    ga = float(ga) if training else 1.0
    if loss_type in TRL_GLOBAL_TOKEN_TYPES:
        if num_items_in_batch is None:
            raise ValueError(f"loss_type={loss_type!r} divides by num_items_in_batch: pass it")
        items = torch.as_tensor(num_items_in_batch, dtype=torch.float32).clamp(min=1.0) / num_processes
        if training:
            items = items * ga / args.steps_per_generation
        return Normalizer(items, ga)
    if loss_type == "bnpo":
        tokens = (mask != 0).sum().to(torch.float32).clamp(min=1.0)
        return Normalizer(tokens * ga, ga)
    return Normalizer(float(mask.shape[0]) * ga, ga)
