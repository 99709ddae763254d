"""Answer correctness: ``math_equal`` (under a hard time limit, see ``pool``) and the accuracy reward.

``extract_answer`` takes the final answer of a completion; ``math_equal`` compares it with the gold answer in a
worker process that is killed at the deadline. The reward is 1.0 for a right answer and 0.0 otherwise
(docs/math.md §4).
"""

from __future__ import annotations

from collections.abc import Sequence

from .pool import VerifierPool, default_pool

__all__ = ["accuracy_reward", "batch_accuracy_reward", "batch_math_equal", "math_equal"]


def math_equal(pred: str | None, gold: str, *, timeout: float = 5.0, pool: VerifierPool | None = None) -> bool:
    """Whether ``pred`` is mathematically the same answer as ``gold``; False if undecided within ``timeout`` s.

    Handles numbers in every common spelling (thousands, decimal commas, mixed numbers), fractions, roots,
    constants, percent, degrees, units (a different unit is a different answer) and ``\\text{}``, expressions
    (random-point evaluation, then simplification), equations and labelled answers ("f(x) = 1"), inequalities,
    tuples, intervals, sets, matrices and lists. Undefined values (1/0), unevaluated sums, integrals and limits,
    rounded decimals and hedged answers are not equal. Malformed input and None are False, not an exception.
    Safe from any thread: the check runs in a worker process that is killed at the deadline.

    Args:
        pred: the predicted answer (e.g. from ``extract_answer``), or None for "no answer". A pred with boxes
            is judged on its boxes.
        gold: the reference answer (LaTeX or plain text), or a solution with boxes, "#### answer" or a final
            answer marker (see ``gold_answer``).
        timeout: seconds the check may run once a worker has it.
        pool: the worker pool to use; default: the process-wide ``default_pool()``.
    """
    return (pool or default_pool()).math_equal(pred, gold, timeout=timeout)


def batch_math_equal(
    pairs: Sequence[tuple[str | None, str]], *, timeout: float = 5.0, pool: VerifierPool | None = None
) -> list[bool]:
    """``math_equal`` for many (pred, gold) pairs, checked in parallel by the pool's workers."""
    return (pool or default_pool()).map(pairs, timeout=timeout)


def accuracy_reward(completion: str, gold: str, *, lenient: bool = False) -> float:
    """1.0 when the completion's final answer equals the gold answer (``math_equal``), else 0.0.

    ``lenient=True`` is for evaluation: a completion without a box or answer marker is judged on its last math
    span or number (see ``extract_answer``). Rewards keep the default, so a policy is paid for stating its answer.
    """
    return batch_accuracy_reward([completion], [gold], lenient=lenient)[0]


def batch_accuracy_reward(
    completions: Sequence[str],
    golds: Sequence[str],
    *,
    timeout: float = 5.0,
    pool: VerifierPool | None = None,
    lenient: bool = False,
) -> list[float]:
    """``accuracy_reward`` over a batch, with all answer checks running in parallel in the verifier pool."""
    if len(completions) != len(golds):
        raise ValueError(f"got {len(completions)} completions but {len(golds)} gold answers")
    for c in completions:
        if not isinstance(c, str):
            raise TypeError(f"completion must be a str, got {type(c).__name__}: {c!r:.80}")
    pairs = list(zip(completions, golds))
    verdicts = (pool or default_pool()).map(pairs, timeout=timeout, extract="lenient" if lenient else "strict")
    return [float(ok) for ok in verdicts]
