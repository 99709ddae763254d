"""What a run checks before it builds anything: the rewards resolve, the dataset can be read, the device
exists, and the output directory is this run's. Each failure is a `ConfigError` naming the field and the
value, raised in seconds instead of after a model download and a warm-up.
"""

import dataclasses
import importlib
import importlib.util
import os
import sys

from fastrl.rewards import WeightedReward, accuracy_reward, combine_rewards, format_reward

from .checkpoint import prepare_output_dir
from .config import TrainConfig
from .tool_options import add_tool_functions
from .trackers import check_installed
from .validate import ConfigError, parse_reward_spec

__all__ = ["build_reward", "preflight", "resolve_reward_spec"]

BUILTIN = {"accuracy": accuracy_reward, "format": format_reward}


def resolve_reward_spec(spec: str) -> tuple[str, object, float]:
    """ "accuracy:1.0" or "my_module:my_fn:0.5" -> (name, callable, weight); imports the module."""
    module_name, function, weight = parse_reward_spec(spec)
    if function is None:
        return module_name, BUILTIN[module_name], weight
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # the console script, unlike `python -m`, does not see the working directory
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError("rewards", spec, f"cannot import {module_name!r}: {e}") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ConfigError("rewards", spec, f"{module_name} has no function {function!r}")
    return function, fn, weight


def build_reward(config: TrainConfig, rewards=None):
    """The weighted sum of the reward terms: `rewards` when given (replacing `config.rewards`), else the config's.

    `rewards` is a list of specs ("accuracy:1.0", "module:function:0.5") and / or the terms
    `fastrl.rewards.combine_rewards` takes: `(fn, weight)`, `(name, fn, weight)` or a `WeightedReward`.
    """
    terms = []
    for term in config.rewards if rewards is None else rewards:
        terms.append(resolve_reward_spec(term) if isinstance(term, str) else term)
    if not terms:
        raise ConfigError("rewards", rewards, "must hold at least one reward")
    for term in terms:
        if not isinstance(term, (tuple, list, WeightedReward)):
            raise ConfigError("rewards", term, "each reward is a spec string, (fn, weight), (name, fn, weight)")
    try:
        return combine_rewards(terms)
    except (TypeError, ValueError) as e:
        raise ConfigError("rewards", rewards if rewards is not None else config.rewards, str(e)) from None


def _check_dataset(config: TrainConfig) -> None:
    source = config.dataset
    if source.startswith("arithmetic"):
        return
    if source.endswith(".jsonl"):
        if not os.path.isfile(source):
            raise ConfigError("dataset", source, "no such file")
        return
    try:
        import datasets  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            "dataset", source, f"a Hugging Face dataset needs the `datasets` package ({e}): pip install datasets "
            "(or pip install 'fastrl[data]'); a local .jsonl file needs nothing",
        ) from None  # fmt: skip


def _check_device(config: TrainConfig) -> None:
    if not config.device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError("device", config.device, "no CUDA device is available (use cpu or auto)")
    index = config.device.partition(":")[2]
    if index and int(index) >= torch.cuda.device_count():
        raise ConfigError("device", config.device, f"there are {torch.cuda.device_count()} CUDA devices")


def preflight(config: TrainConfig, rewards=None):
    """Run every check that needs no model; returns the combined reward. Raises ConfigError."""
    reward = build_reward(config, rewards)
    _check_dataset(config)
    _check_device(config)
    if config.plot and importlib.util.find_spec("matplotlib") is None:
        raise ConfigError("plot", True, "draws curves.png with matplotlib: pip install matplotlib, or pass --no-plot")
    try:
        check_installed(config.trackers)
    except ValueError as e:
        raise ConfigError(None, config.report_to, str(e)) from None  # the message names --report-to and the tracker
    prepare_output_dir(config.output_dir, resume=config.resume, overwrite=config.overwrite)
    return reward


def with_tools(config: TrainConfig, tools) -> TrainConfig:
    """`config` with the tools given from Python (`train(config, tools=[...])`) added to its `tools` as
    `module:function` entries, checked as `--tools` is (the pairs refused with tools included)."""
    if not tools:
        return config
    try:
        spec = add_tool_functions(config.tools, list(tools))
    except ValueError as e:
        raise ConfigError("tools", tools, str(e)) from None
    return dataclasses.replace(config, tools=spec)
