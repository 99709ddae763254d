"""The eval options of `TrainConfig` (`eval_*`): the eval sets they name, and their checks at config time.

`eval_dataset` is a comma list of `[NAME=]SOURCE`; a SOURCE is one of

    arithmetic:<N>           256 fresh draws of the arithmetic task (a seed of their own: the training stream's
                             distribution, not its list; at a small N they are the problems it trains on)
    arithmetic-trained       each distinct problem the training stream draws, once (an arithmetic `dataset`)
    arithmetic-heldout:<N>   the additions with both operands <= N that the training stream never draws
                             (`eval_sets.py`; an arithmetic `dataset`, N above its largest operand)
    FILE.jsonl, HF name      as `dataset` (`prompt_key`, `answer_key`; the split is `eval_dataset_split`)

One set is reported as `eval_<metric>`; with several, each under its name (`eval_<name>_<metric>`): the NAME given,
else the source's (`arithmetic-heldout-19`, a file's stem, a HF dataset's last path part).
"""

import os
import re
from dataclasses import dataclass

from .validate import MIN_TEMPERATURE, ConfigError

__all__ = ["BUILT_IN", "EvalSet", "check_eval_options", "eval_due", "eval_temperature", "parse_eval_sets"]

BUILT_IN = ("arithmetic-trained", "arithmetic-heldout")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class EvalSet:
    name: str | None  # None: the one unnamed set (`eval_<metric>`)
    source: str  # as in the module docstring


def _source_name(source: str) -> str:
    """The name a set is reported under when none is given: the source with what names refuse replaced."""
    if source.endswith(".jsonl"):
        source = os.path.splitext(os.path.basename(source))[0]
    elif not source.startswith("arithmetic"):
        source = source.rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", source).strip("-_.")
    return name or "set"


def _check_source(source: str) -> None:
    head, colon, top = source.partition(":")
    if head in ("arithmetic", "arithmetic-heldout"):
        if not (top.isdigit() and int(top) >= 1):
            raise ValueError(f"{source!r}: {head} needs its largest operand, e.g. {head}:19")
    elif head == "arithmetic-trained":
        if colon:
            raise ValueError(f"{source!r}: arithmetic-trained takes no operand (it is the training stream's list)")
    elif head.startswith("arithmetic"):
        raise ValueError(f"{source!r}: the arithmetic eval sets are arithmetic:<N>, {', '.join(BUILT_IN)}")
    elif not source.strip():
        raise ValueError("an empty eval set")


def parse_eval_sets(spec: str) -> list[EvalSet]:
    """The eval sets of an `eval_dataset` value ([] for ""); ValueError naming the bad part."""
    parts = [p.strip() for p in spec.split(",")] if spec.strip() else []
    sets = []
    for part in parts:
        name, eq, source = part.partition("=")
        name, source = (name.strip(), source.strip()) if eq else (None, part)
        _check_source(source)
        if name is not None and not _NAME.fullmatch(name):
            raise ValueError(f"eval set name {name!r} must match {_NAME.pattern} (letters, digits, _ . -)")
        sets.append(EvalSet(name, source))
    if len(sets) == 1 and sets[0].name is None:
        return sets
    sets = [s if s.name is not None else EvalSet(_source_name(s.source), s.source) for s in sets]
    names = [s.name for s in sets]
    if len(set(names)) < len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"two eval sets are named {twice!r}: name them, e.g. a={sets[0].source},b=...")
    return sets


def eval_temperature(c) -> float:
    """The eval sampling temperature: `eval_temperature`, else greedy (0) at one sample and the training one above."""
    if c.eval_temperature is not None:
        return c.eval_temperature
    return 0.0 if c.eval_samples == 1 else c.temperature


def eval_due(step: int, c) -> bool:
    """Whether the policy after `step` optimizer steps is evaluated: every `eval_every` steps and after the last
    one; step 0 (the starting policy) with `eval_before_train`."""
    if step == 0:
        return c.eval_before_train
    return c.eval_every > 0 and (step % c.eval_every == 0 or step == c.max_steps)


def check_eval_options(c) -> None:
    """The eval fields alone and together (ConfigError naming the value); called by `TrainConfig`."""
    for name in ("eval_every", "eval_max_problems"):
        if getattr(c, name) < 0:
            raise ConfigError(name, getattr(c, name), "must be >= 0 (0 = off / all)")
    if c.eval_samples < 1:
        raise ConfigError("eval_samples", c.eval_samples, "must be >= 1 (completions per eval problem)")
    t = c.eval_temperature
    if t is not None and t != 0 and t < MIN_TEMPERATURE:
        raise ConfigError("eval_temperature", t, f"must be 0 (greedy) or >= {MIN_TEMPERATURE}")
    if t == 0 and c.eval_samples > 1:
        raise ConfigError("eval_temperature", t, f"is greedy: its eval_samples={c.eval_samples} completions per "
                          "problem would be one completion repeated (use eval_samples=1 or a temperature)")  # fmt: skip
    try:
        sets = parse_eval_sets(c.eval_dataset)
    except ValueError as e:
        raise ConfigError("eval_dataset", c.eval_dataset, str(e)) from None
    evaluates = c.eval_every > 0 or c.eval_before_train
    if sets and not evaluates:
        raise ConfigError("eval_dataset", c.eval_dataset, "is never evaluated: set eval_every > 0 and / or "
                          "eval_before_train")  # fmt: skip
    if not sets and evaluates:
        field = "eval_every" if c.eval_every > 0 else "eval_before_train"
        raise ConfigError(field, getattr(c, field), "needs eval_dataset (the problems to evaluate on)")
    trained_on = (c.dataset.partition(":")[2] or "99") if c.dataset.startswith("arithmetic") else None
    for s in sets:
        if s.source.startswith(BUILT_IN) and trained_on is None:
            raise ConfigError("eval_dataset", c.eval_dataset, f"{s.source} is defined by an arithmetic training "
                              f"dataset, and dataset={c.dataset!r}")  # fmt: skip
        head, _, top = s.source.partition(":")
        if head == "arithmetic-heldout" and int(top) <= int(trained_on):
            raise ConfigError("eval_dataset", c.eval_dataset, f"{s.source}: held-out additions need a largest "
                              f"operand above the training set's {trained_on} (dataset={c.dataset!r})")  # fmt: skip
