"""Checking every config value on its own, before anything is built: types, ranges, choices, spec syntax.

The checks are driven by the dataclass annotations (every field gets its type checked and strings from
flags and loose YAML coerced) and by `RULES`, a table of field -> (predicate, what it must be). A new
field gets its type checked for free; a range or a set of choices is one line in the table. A bad value
raises `ConfigError`, which names the field and the value, so the command line can name the flag.
"""

import math
import numbers
import types
import typing

from fastrl.kernels.logprobs.params import MIN_TEMPERATURE  # the log-prob op's floor (float32 logits)

from .trackers import TRACKERS, parse_report_to

__all__ = ["ConfigError", "MIN_TEMPERATURE", "RULES", "check_fields", "check_value", "coerce", "parse_reward_spec"]

BUILTIN_REWARDS = ("accuracy", "format")  # names of `config.rewards`; anything else is module:function
DEVICES = ("auto", "cpu", "cuda")


class ConfigError(ValueError):
    """A bad config value. `field` is its flat name (None for a file or a combination), `value` as given."""

    def __init__(self, field: str | None, value, reason: str):
        self.field, self.value, self.reason = field, value, reason
        super().__init__(f"{field}={value!r}: {reason}" if field else reason)


def _base_type(annotation):
    """(type, optional) of an annotation: `float | None` -> (float, True)."""
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else object), type(None) in args
    return (typing.get_origin(annotation) or annotation), False


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def coerce(name: str, value, annotation):
    """`value` (a flag's string, a YAML/JSON scalar or list, or a Python value) as the field's type."""
    kind, optional = _base_type(annotation)
    if optional and (value is None or isinstance(value, str) and value.strip().lower() in ("none", "null", "")):
        return None
    if kind is tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(name, value, "expects a comma-separated list")
        return tuple(value)
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise ConfigError(name, value, "expects true or false")
    if kind is int:
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                raise ConfigError(name, value, "expects an integer") from None
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ConfigError(name, value, "expects an integer")
        if isinstance(value, numbers.Integral):
            return int(value)
        if math.isfinite(value) and float(value).is_integer():  # YAML reads 1e3 as a float
            return int(value)
        raise ConfigError(name, value, "expects an integer")
    if kind is float:
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise ConfigError(name, value, "expects a number") from None
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ConfigError(name, value, "expects a number")
        if not math.isfinite(value):
            raise ConfigError(name, value, "must be a finite number")
        return float(value)
    if kind is str:
        if not isinstance(value, str):
            raise ConfigError(name, value, "expects a string")
        return value
    return value


def _at_least(low):
    return (lambda v: v >= low), f"must be >= {low}"


def _above(low):
    return (lambda v: v > low), f"must be > {low}"


def _within(low, high, *, open_low=False, open_high=False):
    def ok(v):
        return (v > low if open_low else v >= low) and (v < high if open_high else v <= high)

    return ok, f"must be in {'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"


def _one_of(choices):
    return (lambda v: v in choices), f"must be one of {', '.join(choices)}"


def _device(value: str) -> bool:
    head, _, index = value.partition(":")
    return value in DEVICES or (head == "cuda" and index.isdigit())


def _dataset(value: str) -> bool:
    head, _, top = value.partition(":")
    if value.startswith("arithmetic"):
        return head == "arithmetic" and (top == "" or top.isdigit() and int(top) >= 1)
    if value.startswith("products"):
        return head == "products" and top.isdigit() and int(top) >= 1
    return bool(value.strip())


def parse_reward_spec(spec) -> tuple[str, str | None, float]:
    """ "name[:weight]" (a built-in reward) or "module:function[:weight]" -> (name or module, function, weight).

    Raises ConfigError naming the spec. The function is imported later (`preflight.resolve_rewards`).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("rewards", spec, "each reward is 'name:weight' or 'module:function:weight'")
    parts = spec.strip().split(":")
    weight = 1.0
    if len(parts) > 1:
        try:
            weight = float(parts[-1])
            parts = parts[:-1]
        except ValueError:
            if parts[0] in BUILTIN_REWARDS or len(parts) > 2:
                raise ConfigError("rewards", spec, f"the weight {parts[-1]!r} is not a number") from None
    if not math.isfinite(weight):
        raise ConfigError("rewards", spec, f"the weight {weight} is not finite")
    if len(parts) == 1:
        if parts[0] not in BUILTIN_REWARDS:
            raise ConfigError(
                "rewards", spec, f"unknown reward {parts[0]!r}: the built-in ones are "
                f"{', '.join(BUILTIN_REWARDS)}; a function of your own is 'module:function:weight'",
            )  # fmt: skip
        return parts[0], None, weight
    module, function = parts
    if not module or not function.isidentifier():
        raise ConfigError("rewards", spec, "a reward of your own is 'module:function' or 'module:function:weight'")
    return module, function, weight


def _report_to(value: str) -> bool:
    try:
        parse_report_to(value)
    except ValueError:
        return False
    return True


def _rewards(specs) -> bool:
    for spec in specs:
        parse_reward_spec(spec)
    return len(specs) > 0


# field -> (predicate, what a good value is). Fields not listed get their type checked only.
RULES = {
    "tiny_hidden_size": _at_least(1),
    "tiny_layers": _at_least(1),
    "dataset": (
        _dataset,
        "must be 'arithmetic:<max operand >= 1>', 'products:<digits >= 1>', a .jsonl file or a Hugging Face "
        "dataset name",
    ),
    "warmup_sft_steps": _at_least(0),
    "warmup_sft_noise": _within(0, 1),
    "warmup_sft_lr": _above(0),
    "warmup_sft_batch_size": _at_least(1),
    "engine": _one_of(("auto", "hf", "vllm")),
    "prompts_per_step": _at_least(1),
    "group_size": _at_least(1),
    "max_prompt_length": _at_least(1),
    "max_completion_length": _at_least(1),
    "temperature": _at_least(MIN_TEMPERATURE),
    "top_p": _within(0, 1, open_low=True),
    "top_k": _at_least(0),
    "min_p": _within(0, 1),
    "sampler_replay": _one_of(("auto", "on", "off")),
    "vllm_gpu_memory_utilization": _within(0, 1, open_low=True),
    "vllm_dtype": _one_of(("auto", "float32", "bfloat16", "float16")),
    "vllm_kv_cache_gib": _at_least(0),
    "vllm_sleep_level": ((lambda v: v in (0, 1, 2)), "must be one of 0, 1, 2"),
    "async_staleness": _at_least(-1),
    "rollout_chunk_tokens": _at_least(0),
    "rollout_timeout_s": _above(0),
    "thinking_budget": _at_least(0),
    "min_completion_length": _at_least(0),
    "rewards": (_rewards, "must name at least one reward"),
    "overlong_buffer": _at_least(0),
    "advantage_scale": _one_of(("std", "batch-std", "none")),
    "impl": _one_of(("auto", "triton", "torch")),
    "ppo_epochs": _at_least(1),
    "minibatches": _at_least(1),
    "max_tokens_per_microbatch": _at_least(1),
    "sequence_parallel": _at_least(1),
    "packing": _one_of(("auto", "on", "off")),
    "lr": _above(0),
    "weight_decay": _at_least(0),
    "adam_beta2": _within(0, 1, open_high=True),
    "max_grad_norm": _at_least(0),
    "lr_schedule": _one_of(("constant", "cosine", "linear")),
    "lr_warmup_steps": _at_least(0),
    "output_dir": ((lambda v: bool(v.strip())), "must be a directory path"),
    "max_steps": _at_least(1),
    "save_steps": _at_least(0),
    "keep_checkpoints": _at_least(0),
    "seed": _at_least(0),
    "report_to": (_report_to, f"must be none or a comma list of {', '.join(TRACKERS)}, each once"),
    "log_every": _at_least(0),
    "num_threads": _at_least(0),
    "device": (_device, f"must be one of {', '.join(DEVICES)} or cuda:<index>"),
}


def check_value(name: str, value, annotation) -> None:
    """The type and the rule of one field's value; raises ConfigError."""
    kind, optional = _base_type(annotation)
    if optional and value is None:
        return
    if kind in (bool, int, float, str, tuple):
        if coerce(name, value, annotation) != value or (kind is not float and type(value) is not kind):
            raise ConfigError(name, value, f"expects {kind.__name__}")
    if name in RULES:
        ok, what = RULES[name]
        if not ok(value):
            raise ConfigError(name, value, what)


def check_fields(config) -> None:
    """Type and rule of every field of a (trainer) config dataclass; raises ConfigError on the first bad one."""
    for name, annotation in typing.get_type_hints(type(config)).items():
        check_value(name, getattr(config, name), annotation)
