"""`fastrl train`: the command line of the GRPO trainer.

    fastrl train --preset tiny --output-dir runs/tiny
    fastrl train --preset tiny --output-dir runs/tiny --max-steps 40 --save-steps 10 --resume
    fastrl train --config my_run.yaml --lr 2e-6          # file values, then flags on top
    torchrun --nproc-per-node 8 -m fastrl.trainer train --preset math-32k \
        --model deepseek-ai/DeepSeek-R1-Distill-Qwen-7B --fsdp        # sharded: docs/distributed.md
    fastrl export runs/math-32k/checkpoints/step-00000100 hf-model/  # an --fsdp checkpoint as an HF model

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

from .config import PRESETS, TrainConfig, config_fields, config_to_dict, make_config


def _field_help() -> dict:
    """The one-line comment after each config field (the trainer's and the loss's), as its --help text."""
    src = inspect.getsource(LossConfig) + inspect.getsource(TrainConfig)
    return {m.group(1): m.group(2) for m in re.finditer(r"^\s+(\w+): [^=]+=.*?#\s*(.+)$", src, re.MULTILINE)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastrl", description="fastrl: GRPO training with fused, memory-bounded losses"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="run GRPO training", argument_default=argparse.SUPPRESS)
    train.add_argument("--preset", choices=sorted(PRESETS), help="start from a named configuration")
    train.add_argument("--config", help="YAML or JSON file of config fields")
    train.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    helps = _field_help()
    for name, default in config_fields().items():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            train.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, help=helps.get(name))
        else:
            train.add_argument(flag, dest=name, metavar=name.upper(), help=helps.get(name))
    export = sub.add_parser("export", help="write an --fsdp (sharded) checkpoint as a Hugging Face model directory")
    export.add_argument("checkpoint", help="a checkpoints/step-N directory written with --fsdp")
    export.add_argument("out_dir", help="the Hugging Face model directory to write")
    return parser


def parse_config(argv: list[str]) -> tuple[TrainConfig, dict]:
    args = vars(build_parser().parse_args(argv))
    args.pop("command")
    preset, file = args.pop("preset", None), args.pop("config", None)
    flags = {"print_config": args.pop("print_config", False)}
    return make_config(preset, file, **args), flags


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["export"]:
        return _export(build_parser().parse_args(argv))
    try:
        config, flags = parse_config(argv)
    except (TypeError, ValueError) as e:
        print(f"fastrl: error: {e}", file=sys.stderr)
        return 2
    if flags["print_config"]:
        print(json.dumps(config_to_dict(config), indent=2))
        return 0
    from .trainer import train

    last = train(config)
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
