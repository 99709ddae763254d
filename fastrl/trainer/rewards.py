"""Verifiable rewards for math RL: answer correctness, format, length shaping, and their weighted combination.

A reward function is any ``fn(completion: str, gold: str) -> float`` (``RewardFn``). ``combine_rewards`` weighs
several into one ``CombinedReward`` that scores a whole batch, returns the total and each function's values (for
logging), and runs a function's batch form (``accuracy_reward`` -> ``batch_accuracy_reward``, which checks all
pairs in parallel in the verifier pool) when it has one. Length shaping needs the whole group's lengths, so it is
separate: ``length_penalty`` (Kimi k1.5) per group and ``overlong_penalty`` (DAPO) per completion.

Correctness: ``extract_answer`` takes the final answer; ``math_equal`` compares it with the gold answer
(sympy, under a hard time limit enforced by killing a worker process; see ``verifier_pool``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .math_normalize import extract_answer
from .verifier_pool import VerifierPool, default_pool

__all__ = [
    "RewardFn",
    "BatchRewardFn",
    "WeightedReward",
    "CombinedReward",
    "combine_rewards",
    "extract_answer",
    "math_equal",
    "batch_math_equal",
    "accuracy_reward",
    "batch_accuracy_reward",
    "format_reward",
    "length_penalty",
    "overlong_penalty",
    "VerifierPool",
    "default_pool",
]

RewardFn = Callable[[str, str], float]  # (completion, gold answer) -> reward
BatchRewardFn = Callable[[Sequence[str], Sequence[str]], list[float]]  # (completions, golds) -> rewards


def math_equal(pred: str | None, gold: str, *, timeout: float = 5.0, pool: VerifierPool | None = None) -> bool:
    """Whether ``pred`` is mathematically the same answer as ``gold``; False if undecided within ``timeout`` s.

    Handles numbers in every common spelling, fractions, roots, constants, percent (either reading), degrees,
    units and ``\\text{}``, expressions (random-point evaluation, then simplification), equations, inequalities,
    tuples, intervals, sets and comma-separated lists. Malformed input and None are False, not an exception.
    Safe from any thread: the check runs in a worker process that is killed at the deadline.

    Args:
        pred: the predicted answer (e.g. from ``extract_answer``), or None for "no answer".
        gold: the reference answer (LaTeX or plain text).
        timeout: seconds the check may run once a worker has it.
        pool: the worker pool to use; default: the process-wide ``default_pool()``.
    """
    return (pool or default_pool()).math_equal(pred, gold, timeout=timeout)


def batch_math_equal(
    pairs: Sequence[tuple[str | None, str]], *, timeout: float = 5.0, pool: VerifierPool | None = None
) -> list[bool]:
    """``math_equal`` for many (pred, gold) pairs, checked in parallel by the pool's workers."""
    return (pool or default_pool()).map(pairs, timeout=timeout)


def _gold_answer(gold: str | int | float) -> str:
    if isinstance(gold, (int, float)) and not isinstance(gold, bool):
        return str(gold)  # GSM8K-style datasets store numbers
    if not isinstance(gold, str):
        raise TypeError(f"gold must be a str (or a number), got {type(gold).__name__}: {gold!r:.80}")
    # Datasets store the gold bare ("3/4"), as a full solution ending in \boxed{3/4} (MATH) or in "#### 3/4" (GSM8K).
    if "####" in gold:
        return gold.rsplit("####", 1)[1].strip()
    boxed = extract_answer(gold) if "\\boxed" in gold or "\\fbox" in gold else None
    return boxed if boxed is not None else gold


def accuracy_reward(completion: str, gold: str) -> float:
    """1.0 when the completion's final answer equals the gold answer (``math_equal``), else 0.0."""
    return batch_accuracy_reward([completion], [gold])[0]


def batch_accuracy_reward(
    completions: Sequence[str], golds: Sequence[str], *, timeout: float = 5.0, pool: VerifierPool | None = None
) -> list[float]:
    """``accuracy_reward`` over a batch, with all answer checks running in parallel in the verifier pool."""
    if len(completions) != len(golds):
        raise ValueError(f"got {len(completions)} completions but {len(golds)} gold answers")
    pairs = [(extract_answer(c), _gold_answer(g)) for c, g in zip(completions, golds)]
    return [float(ok) for ok in batch_math_equal(pairs, timeout=timeout, pool=pool)]


_FORMAT_RE = re.compile(r"^\s*<think>(?P<reasoning>.*?)</think>(?P<answer>.*)$", re.DOTALL)


def format_reward(completion: str, gold: str | None = None, *, think_in_prompt: bool = False) -> float:
    """1.0 for ``<think>reasoning</think>`` followed by an answer (a complete ``\\boxed{}`` or answer marker).

    The reasoning must be non-empty and each think tag must appear exactly once, in that order. ``gold`` is
    ignored; it is accepted so that the function fits the ``RewardFn`` protocol.

    Args:
        think_in_prompt: the chat template already opened ``<think>`` (DeepSeek-R1 style), so the completion
            starts inside the reasoning and must contain ``</think>`` but not ``<think>``. Use it through
            ``functools.partial(format_reward, think_in_prompt=True)``.
    """
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a str, got {type(completion).__name__}: {completion!r:.80}")
    if think_in_prompt:
        if "<think>" in completion:
            return 0.0
        completion = "<think>" + completion
    m = _FORMAT_RE.match(completion)
    if m is None or "<think>" in m.group("answer") or "</think>" in m.group("answer"):
        return 0.0
    if "<think>" in m.group("reasoning") or not m.group("reasoning").strip():
        return 0.0
    return 1.0 if extract_answer(m.group("answer")) is not None else 0.0


def length_penalty(lengths: Sequence[int], correct: Sequence[bool]) -> list[float]:
    """Kimi k1.5 length reward over one group of completions of the same prompt.

    ``lambda_i = 0.5 - (len_i - min_len) / (max_len - min_len)``; a correct completion gets ``lambda_i``, a
    wrong one ``min(0, lambda_i)`` (short wrong answers are not rewarded). All lengths equal gives zeros.

    Args:
        lengths: completion lengths in tokens, one per completion of the group.
        correct: whether each completion's answer is right.
    Returns:
        One reward in [-0.5, 0.5] per completion.
    """
    if len(lengths) != len(correct):
        raise ValueError(f"got {len(lengths)} lengths but {len(correct)} correctness flags")
    for n in lengths:
        if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n) or n < 0:
            raise ValueError(f"lengths must be finite numbers >= 0, got {n!r}")
    if not lengths:
        return []
    lo, hi = min(lengths), max(lengths)
    if hi == lo:
        return [0.0] * len(lengths)
    lams = [0.5 - (n - lo) / (hi - lo) for n in lengths]
    return [lam if ok else min(0.0, lam) for lam, ok in zip(lams, correct)]


def overlong_penalty(length: int, max_length: int, buffer: int) -> float:
    """DAPO soft overlong penalty: 0 up to ``max_length - buffer``, then linear down to -1 at ``max_length``.

    Beyond ``max_length`` (a truncated completion) the penalty stays -1. ``buffer=0`` is a hard cutoff.
    """
    for name, v in (("length", length), ("max_length", max_length), ("buffer", buffer)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    if max_length <= 0:
        raise ValueError(f"max_length must be > 0, got {max_length!r}")
    if buffer > max_length:
        raise ValueError(f"buffer must be <= max_length ({max_length!r}), got {buffer!r}")
    start = max_length - buffer
    if length <= start:
        return 0.0
    if length > max_length:
        return -1.0
    return (start - length) / buffer


@dataclass(frozen=True)
class WeightedReward:
    """One term of a combined reward."""

    fn: RewardFn  # (completion, gold) -> float
    weight: float = 1.0  # multiplies the term in the total
    name: str | None = None  # key in the per-function values; default fn.__name__
    batch_fn: BatchRewardFn | None = None  # optional faster batch form; default: known ones, else a loop


# Batch forms used automatically when one of these functions is combined.
_KNOWN_BATCH_FORMS: dict[Callable, BatchRewardFn] = {accuracy_reward: batch_accuracy_reward}


@dataclass(frozen=True)
class RewardScores:
    total: list[float]  # the weighted sum, one per completion
    per_fn: dict[str, list[float]]  # each function's unweighted values, for logging


class CombinedReward:
    """A weighted sum of reward functions; itself a ``RewardFn``. Build it with ``combine_rewards``."""

    def __init__(self, terms: Sequence[WeightedReward]) -> None:
        if not terms:
            raise ValueError("combine_rewards needs at least one reward function, got none")
        names = [t.name or getattr(t.fn, "__name__", None) for t in terms]
        for term, name in zip(terms, names):
            if not callable(term.fn):
                raise TypeError(f"reward function must be callable, got {term.fn!r}")
            if isinstance(term.weight, bool) or not isinstance(term.weight, (int, float)):
                raise TypeError(f"reward weight must be a number, got {term.weight!r}")
            if not math.isfinite(term.weight):
                raise ValueError(f"reward weight must be finite, got {term.weight!r} for {name!r}")
            if name is None:
                raise ValueError(f"reward function {term.fn!r} has no __name__: give it a name")
        if len(set(names)) != len(names):
            raise ValueError(f"reward names must be unique, got {names}")
        self.terms = list(terms)
        self.names = names

    def __call__(self, completion: str, gold: str) -> float:
        return self.score([completion], [gold]).total[0]

    def score(self, completions: Sequence[str], golds: Sequence[str]) -> RewardScores:
        """Score a batch: the weighted total and each function's values, one per completion."""
        if len(completions) != len(golds):
            raise ValueError(f"got {len(completions)} completions but {len(golds)} gold answers")
        per_fn: dict[str, list[float]] = {}
        total = [0.0] * len(completions)
        for term, name in zip(self.terms, self.names):
            batch = term.batch_fn or _KNOWN_BATCH_FORMS.get(term.fn)
            values = batch(completions, golds) if batch else [term.fn(c, g) for c, g in zip(completions, golds)]
            values = [float(v) for v in values]
            if len(values) != len(completions):
                raise ValueError(f"reward {name!r} returned {len(values)} values for {len(completions)} completions")
            bad = [v for v in values if not math.isfinite(v)]
            if bad:
                raise ValueError(f"reward {name!r} returned a non-finite value: {bad[0]!r}")
            per_fn[name] = values
            total = [t + term.weight * v for t, v in zip(total, values)]
        return RewardScores(total=total, per_fn=per_fn)


def combine_rewards(terms: Sequence[WeightedReward | tuple]) -> CombinedReward:
    """Weigh reward functions into one: ``combine_rewards([(accuracy_reward, 1.0), (format_reward, 0.1)])``.

    Each term is a ``WeightedReward``, a ``(fn, weight)`` pair or a ``(name, fn, weight)`` triple.
    """
    parsed = []
    for term in terms:
        if isinstance(term, WeightedReward):
            parsed.append(term)
        elif isinstance(term, tuple) and len(term) == 2:
            parsed.append(WeightedReward(fn=term[0], weight=term[1]))
        elif isinstance(term, tuple) and len(term) == 3 and isinstance(term[0], str):
            parsed.append(WeightedReward(fn=term[1], weight=term[2], name=term[0]))
        else:
            raise TypeError(f"each term must be (fn, weight), (name, fn, weight) or WeightedReward, got {term!r}")
    return CombinedReward(parsed)
