"""verl's actor loss (`verl.workers.utils.losses.ppo_loss`) as a `LossConfig`, and its normalizer.

fastrl's knowledge of verl (its policy-loss modes, KL types, rollout corrections and divisors), with no verl
import: `loss_config_from_verl` and `verl_normalizer` serve a caller of `policy_loss` without verl, and
`fastrl.integrations.verl` reads them from here.
"""

from collections.abc import Mapping

from fastrl.losses import LossConfig, Normalizer

__all__ = ["VERL_KL", "VERL_POLICY_LOSSES", "loss_config_from_verl", "verl_normalizer"]

VERL_POLICY_LOSSES = ("vanilla", "gspo", "sapo", "cispo", "gpg")
# kl_loss_type → (fastrl estimator, clamp of the estimate); verl's "+" types take k2's gradient
_VERL_KL_NAMES = {
    "k1": ("k1", None), "abs": ("abs", None), "k2": ("k2", None), "k3": ("k3", 10.0),
    "k1+": ("k1+", None), "k2+": ("k2", None), "k3+": ("k3+", 10.0),
}  # fmt: skip
# and verl's older names for them
VERL_KL = _VERL_KL_NAMES | {
    old + plus: _VERL_KL_NAMES[new + plus]
    for old, new in (("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3"))
    for plus in ("", "+")
}
# verl clamps every log IS ratio to ±20 before exp
VERL_IS_LOG_BOUND = 20.0


def _get(node, name, default=None):
    if node is None:
        return default
    if isinstance(node, Mapping):
        return node.get(name, default)
    try:  # OmegaConf DictConfig and verl's dataclass configs
        value = node.get(name, default) if hasattr(node, "get") else getattr(node, name, default)
    except (AttributeError, KeyError):
        value = default
    return default if value is None and default is not None else value


def _is_threshold(spec):
    if isinstance(spec, bool) or spec is None:
        raise ValueError(f"rollout_is_threshold must be a float or 'lower_upper', got {spec!r}")
    if isinstance(spec, str) and "_" in spec:
        low, high = spec.split("_", 1)
        return "mask", float(low), float(high)
    return "truncate", None, float(spec)


def _rejection_rules(options, thresholds):
    """verl's `rollout_rs` / `rollout_rs_threshold` strings → `LossConfig.rejection` rules, parsed as verl does."""
    names = list(dict.fromkeys(o.strip() for o in str(options).split(",") if o.strip()))
    if thresholds is None:
        raise ValueError("rollout_correction.rollout_rs needs rollout_rs_threshold")
    specs = [thresholds] if isinstance(thresholds, (int, float)) else [t.strip() for t in str(thresholds).split(",")]
    specs = [str(t) for t in specs if str(t)]
    if len(specs) == 1:
        specs = specs * len(names)
    if len(specs) != len(names):
        raise ValueError(f"rollout_rs_threshold {thresholds!r} must give one value or one per option of {names}")
    rules = []
    for name, spec in zip(names, specs):
        if name.endswith("k1"):
            low, high = spec.split("_", 1) if "_" in spec else (1.0 / float(spec), spec)
            rules.append((name, float(low), float(high)))
        else:
            rules.append((name, None, float(spec)))
    return tuple(rules)


def loss_config_from_verl(actor, *, rollout_correction=None, temperature: float = 1.0) -> LossConfig:
    """The config whose loss equals verl's actor loss for `actor` (`actor_rollout_ref.actor`: a dict, OmegaConf
    node or verl `ActorConfig`); `rollout_correction` is `algorithm.rollout_correction` (same forms, or None),
    `temperature` the rollout's sampling temperature.

    Raises:
        ValueError: naming every option that fastrl does not reproduce.
    """
    unsupported = []
    policy = _get(actor, "policy_loss", {})
    mode = _get(policy, "loss_mode", "vanilla")
    if mode not in VERL_POLICY_LOSSES:
        unsupported.append(f"policy_loss.loss_mode={mode!r} (supported: {VERL_POLICY_LOSSES})")
    clip = float(_get(actor, "clip_ratio", 0.2))
    low, high = _get(actor, "clip_ratio_low", None), _get(actor, "clip_ratio_high", None)
    fields = dict(eps_low=clip if low is None else float(low), eps_high=clip if high is None else float(high))
    agg = _get(actor, "loss_agg_mode", "token-mean")
    fields.update(loss_agg=agg, count_empty_rows=False, temperature=float(temperature))
    if mode == "vanilla":
        fields.update(pg_loss="clip", dual_clip=float(_get(actor, "clip_ratio_c", 3.0)))
    elif mode == "gspo":  # GSPO-token, always seq-mean-token-mean
        fields.update(pg_loss="clip", ratio_level="sequence-token", loss_agg="seq-mean-token-mean")
    elif mode == "sapo":
        fields.update(pg_loss="sapo", loss_agg="seq-mean-token-mean")
        fields.update(sapo_tau_pos=float(_get(actor, "tau_pos", 1.0)), sapo_tau_neg=float(_get(actor, "tau_neg", 1.05)))
    elif mode in ("cispo", "gpg"):
        fields.update(pg_loss=mode)
    if mode in ("gspo", "sapo") and agg != "seq-mean-token-mean":
        if _get(actor, "use_kl_loss", False) or float(_get(actor, "entropy_coeff", 0.0)) != 0:
            unsupported.append(
                f"policy_loss.loss_mode={mode!r} with loss_agg_mode={agg!r} and a KL or entropy term (verl "
                "aggregates the policy term by sequence but those by loss_agg_mode)"
            )
    if fields["loss_agg"] == "seq-mean-token-sum-norm":
        scale = _get(actor, "loss_scale_factor", None)
        if scale is None:
            unsupported.append(
                "loss_agg_mode='seq-mean-token-sum-norm' with loss_scale_factor=None (verl then divides by each "
                "micro-batch's padded length); set loss_scale_factor"
            )
        else:
            fields["max_completion_length"] = int(scale)
    fields["entropy_coef"] = float(_get(actor, "entropy_coeff", 0.0))
    if _get(actor, "use_kl_loss", False):
        kind = _get(actor, "kl_loss_type", "low_var_kl")
        if kind not in VERL_KL:
            unsupported.append(f"kl_loss_type={kind!r} (supported: {tuple(VERL_KL)})")
        else:
            kl, kl_clip = VERL_KL[kind]
            fields.update(beta=float(_get(actor, "kl_loss_coef", 0.001)), kl=kl, kl_clip=kl_clip)
    level = _get(rollout_correction, "rollout_is", None)
    if level is not None:
        kind, lower, upper = _is_threshold(_get(rollout_correction, "rollout_is_threshold", 2.0))
        fields.update(is_level=level, is_mode=kind, is_min=lower, is_cap=upper, is_log_clip=VERL_IS_LOG_BOUND)
    if _get(rollout_correction, "rollout_is_batch_normalize", False):
        unsupported.append("rollout_correction.rollout_is_batch_normalize=True")
    rs = _get(rollout_correction, "rollout_rs", None)
    if rs is not None:
        fields["rejection"] = _rejection_rules(rs, _get(rollout_correction, "rollout_rs_threshold", None))
    if _get(rollout_correction, "bypass_mode", False):
        unsupported.append("rollout_correction.bypass_mode=True")
    if unsupported:
        raise ValueError("fastrl does not reproduce these verl settings: " + "; ".join(unsupported))
    return LossConfig(**fields)


def verl_normalizer(config, *, dp_size: int = 1, batch_num_tokens=None, global_batch_size=None) -> Normalizer:
    """The `normalizer=` that makes one micro-batch call equal verl's `ppo_loss` on it.

    verl's engine passes the mini-batch's global counts to every micro-batch: `batch_num_tokens` (loss
    tokens over all data-parallel ranks) and `global_batch_size` (sequences, `ppo_mini_batch_size × n`),
    and `dp_size`. Without them (both None, dp_size 1) verl divides by the call's own count: the
    default of a config from `loss_config_from_verl`.
    """
    if isinstance(dp_size, bool) or not isinstance(dp_size, int) or dp_size < 1:
        raise ValueError(f"dp_size must be a positive int, got {dp_size!r}")
    agg = config.loss_agg
    if agg == "token-sum":
        return Normalizer(1.0 / dp_size)
    count = batch_num_tokens if agg == "token-mean" else global_batch_size
    name = "batch_num_tokens" if agg == "token-mean" else "global_batch_size"
    if count is None:
        if dp_size > 1:
            raise ValueError(f"loss_agg={agg!r} with dp_size={dp_size} > 1 needs {name} (as verl does)")
        return Normalizer(None)
    return Normalizer(count / dp_size)
