"""Held-out problems of the arithmetic task: additions the training stream never draws.

The training stream (`tasks.PromptStream`) serves the problems `tasks.load_problems(dataset, seed)` returns, a
fresh shuffle of all of them each epoch, so the prompts it ever draws are exactly that list's prompts. At the
tiny preset's `arithmetic:9` the 4,096 draws cover all 100 pairs (a, b) with 0 <= a, b <= 9, so a held-out set
needs a wider operand range: `held_out_arithmetic("arithmetic:9", seed, n=64, max_operand=19)` gives 64 distinct
additions with an operand in 10..19 (both operands in 0..19), none of them a training prompt. The tiny model
does not learn those from single-digit training (greedy pass@1: 1/64 after the warm-up and one step, 1/64 after
the preset's 100 steps), so its in-distribution set is `trained_arithmetic`: each problem the stream draws, once.
"""

import random

from .tasks import Problem, load_problems


def training_prompts(dataset: str, seed: int) -> set[str]:
    """Every prompt the training stream of an `arithmetic:<max operand>` dataset can draw."""
    if not dataset.startswith("arithmetic"):
        raise ValueError(f"held-out arithmetic problems need an arithmetic dataset, got {dataset!r}")
    return {p.prompt for p in load_problems(dataset, seed)}


def held_out_arithmetic(dataset: str, seed: int, n: int, max_operand: int) -> list[Problem]:
    """`n` distinct additions "a+b=" with 0 <= a, b <= `max_operand` that the training stream never draws.

    Args:
        dataset: the training dataset, `arithmetic:<max operand>` (as `--dataset`).
        seed: the training seed (the training problems depend on it).
        n: how many held-out problems.
        max_operand: the largest operand of a held-out problem.
    Returns:
        `n` problems in a fixed order for (`dataset`, `seed`, `n`, `max_operand`).
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    if not isinstance(max_operand, int) or max_operand < 0:
        raise ValueError(f"max_operand must be an int >= 0, got {max_operand!r}")
    seen = training_prompts(dataset, seed)
    unseen = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1) if f"{a}+{b}=" not in seen]
    if len(unseen) < n:
        raise ValueError(
            f"only {len(unseen)} additions with operands <= {max_operand} are not drawn by {dataset!r} "
            f"(seed {seed}); {n} were asked for: raise max_operand"
        )
    random.Random(seed * 1_000_033 + max_operand).shuffle(unseen)
    return [Problem(f"{a}+{b}=", str(a + b)) for a, b in unseen[:n]]


def trained_arithmetic(dataset: str, seed: int) -> list[Problem]:
    """Every distinct problem the training stream of an `arithmetic:<max operand>` dataset draws, once, by prompt."""
    if not dataset.startswith("arithmetic"):
        raise ValueError(f"trained arithmetic problems need an arithmetic dataset, got {dataset!r}")
    return sorted({p.prompt: p for p in load_problems(dataset, seed)}.values(), key=lambda p: p.prompt)
