"""`fastrl train`: the command line of the GRPO trainer.

    fastrl train --preset tiny --output-dir runs/tiny
    fastrl train --preset tiny --output-dir runs/tiny --max-steps 40 --save-steps 10 --resume
    fastrl train --config my_run.yaml --lr 2e-6          # file values, then flags on top
    torchrun --nproc-per-node 8 -m fastrl.trainer train --preset math-32k \
        --model deepseek-ai/DeepSeek-R1-Distill-Qwen-7B --fsdp        # sharded: docs/distributed.md
    fastrl export runs/math-32k/checkpoints/step-00000100 hf-model/  # an --fsdp checkpoint as an HF model
    fastrl plot runs/tiny runs/tiny-2 --out compare.png                # runs' curves, overlaid (plot.py)

Every field of `TrainConfig` and every knob of its `LossConfig` is a flag (`--field-name value`;
booleans also as `--flag` / `--no-flag`; tuples comma-separated).
Precedence: defaults < --preset < --config file < flags.
"""

import argparse
import inspect
import json
import re
import sys

from fastrl.losses import LossConfig

from .config import PRESETS, TrainConfig, config_fields, config_to_dict, make_config, read_config_file
from .preflight import build_reward
from .rollout.async_client import RolloutWorkerError
from .validate import ConfigError


def _field_help() -> dict:
    """The one-line comment after each config field (the trainer's and the loss's), as its --help text."""
    src = inspect.getsource(LossConfig) + inspect.getsource(TrainConfig)
    return {m.group(1): m.group(2) for m in re.finditer(r"^\s+(\w+): [^=]+=.*?#\s*(.+)$", src, re.MULTILINE)}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block: the message names the flag
        self.exit(2, f"{self.prog}: error: {message}\n")


def _shown(default) -> str:
    if isinstance(default, tuple):
        return ",".join(map(str, default))
    return str(default)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fastrl", description="fastrl: GRPO training with fused, memory-bounded losses")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="run GRPO training", argument_default=argparse.SUPPRESS)
    train.add_argument("--preset", choices=sorted(PRESETS), help="start from a named configuration")
    train.add_argument("--config", help="YAML or JSON file of config fields")
    train.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    helps = _field_help()
    for name, default in config_fields().items():
        flag = "--" + name.replace("_", "-")
        text = f"{helps.get(name, '')} (default: {_shown(default)})".strip().replace("%", "%%")
        if isinstance(default, bool):
            train.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, help=text)
        else:
            train.add_argument(flag, dest=name, metavar=name.upper(), help=text)
    plot = sub.add_parser("plot", help="draw runs' metrics.jsonl against step as a PNG (fastrl plot --help)",
                          add_help=False)  # fmt: skip
    plot.add_argument("args", nargs=argparse.REMAINDER, help="RUN_DIR [RUN_DIR ...] [--out FILE.png]")
    export = sub.add_parser("export", help="write an --fsdp (sharded) checkpoint as a Hugging Face model directory")
    export.add_argument("checkpoint", help="a checkpoints/step-N directory written with --fsdp")
    export.add_argument("out_dir", help="the Hugging Face model directory to write")
    return parser


def _parse(argv: list[str]) -> tuple[str | None, str | None, bool, dict]:
    """(preset, config file, --print-config, {field: the flag's value as given})."""
    args = vars(build_parser().parse_args(argv))
    args.pop("command")
    return args.pop("preset", None), args.pop("config", None), args.pop("print_config", False), args


def parse_config(argv: list[str]) -> tuple[TrainConfig, dict]:
    """(config, {"print_config": bool}); ConfigError (a ValueError) on a bad value."""
    preset, file, print_config, given = _parse(argv)
    return make_config(preset, file, **given), {"print_config": print_config}


def describe(error: ConfigError, given: dict, file: str | None = None) -> str:
    """The one-line message of a bad value, naming the flag (or the config file's key) and the value."""
    field = error.field
    if field is None:
        return error.reason
    flag = "--" + field.replace("_", "-")
    if field in ("config", "preset"):
        return f"{flag} {error.value}: {error.reason}"
    if field in given:
        value = given[field]
        return f"{flag}: {error.reason}" if isinstance(value, bool) else f"{flag} {value}: {error.reason}"
    if file is not None and field in _file_keys(file):
        return f"{field}={error.value!r} in {file}: {error.reason}"
    return f"{field}={error.value!r}: {error.reason}"


def _file_keys(file: str) -> set:
    try:
        return set(read_config_file(file))
    except ConfigError:
        return set()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plot"]:
        from .plot import main as plot_main

        return plot_main(argv[1:])
    if argv[:1] == ["export"]:
        return _export(build_parser().parse_args(argv))
    preset, file, print_config, given = _parse(argv)
    try:
        config = make_config(preset, file, **given)
        if print_config:
            build_reward(config)  # a reward of the user's own must import
            print(json.dumps(config_to_dict(config), indent=2))
            return 0
        from .trainer import train

        last = train(config)
    except ConfigError as e:
        print(f"fastrl: error: {describe(e, given, file)}", file=sys.stderr)
        return 2
    except RolloutWorkerError as e:  # the rollout process died or hung: one message, no traceback
        print(f"fastrl: error: {e}", file=sys.stderr)
        return 1
    if last:
        keys = ("step", "reward_correct_mean", "reward_mean", "loss", "elapsed_s")
        print(json.dumps({k: last[k] for k in keys if k in last}))
    return 0


def _export(args) -> int:
    from .sharded_checkpoint import export_hf

    try:
        print(export_hf(args.checkpoint, args.out_dir))
    except ValueError as e:
        print(f"fastrl: error: {e}", file=sys.stderr)
        return 2
    return 0
