"""Shaping rewards: output format (``<think>`` then an answer) and length terms (Kimi k1.5, DAPO); docs/math.md §4."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from .extract import extract_answer

__all__ = ["format_reward", "length_penalty", "overlong_penalty"]


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
