"""Weighted combination of reward functions into one batch scorer (docs/math.md §4).

A reward function is any ``fn(completion: str, gold: str) -> float`` (``RewardFn``). ``combine_rewards`` weighs
several into one ``CombinedReward`` that scores a whole batch, returns the total and each function's values (for
logging), and runs a function's batch form (``accuracy_reward`` -> ``batch_accuracy_reward``, which checks all
pairs in parallel in the verifier pool) when it has one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .accuracy import accuracy_reward, batch_accuracy_reward

__all__ = ["BatchRewardFn", "CombinedReward", "RewardFn", "RewardScores", "WeightedReward", "combine_rewards"]

RewardFn = Callable[[str, str], float]  # (completion, gold answer) -> reward
BatchRewardFn = Callable[[Sequence[str], Sequence[str]], list[float]]  # (completions, golds) -> rewards


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
