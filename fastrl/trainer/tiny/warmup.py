"""The tiny tasks' demonstrations for the supervised warm-up (`trainer/warmup.py` trains on them).

Warming up on demonstrations that are right only some of the time leaves the model with a partial skill
(it knows the format and puts some probability on the right answer), which GRPO then sharpens from rewards.
"""

import random

from fastrl.tools import output_block


def arithmetic_completion(prompt: str, answer: str) -> str:
    """The tiny task's completion: a reasoning block restating the sum, then the boxed answer.

    It satisfies `format_reward` (non-empty `<think>` block, then `\\boxed{}`) in 8-9 tokens.
    """
    return f"<think>{prompt.rstrip('=')}</think>\\boxed{{{answer}}}"


def noisy_demonstration(problem, rng: random.Random, noise: float) -> str:
    """A warm-up target for `problem` (a `tasks.Problem`): right with probability 1 - noise, else a plausible slip
    (off by 1 or 10).

    Warming up on these leaves the model with a *partial* skill: it knows the format and puts some of its
    probability on the right sum, but samples a near miss most of the time. Only the reward tells the
    samples apart, which is what GRPO has to learn from.
    """
    answer = int(problem.answer)
    if rng.random() < noise:
        answer = max(0, answer + rng.choice((-10, -1, 1, 10)))
    return arithmetic_completion(problem.prompt, str(answer))


def tool_demonstration(problem, rng: random.Random, noise: float) -> list[tuple[str, bool]]:
    """A warm-up target for a products problem "a*b=" as (text, sampled) pieces: with probability 1 - noise the
    python tool's call, its observation (not sampled: the warm-up's loss skips it, as GRPO's does) and the answer
    copied from it; else a guess: the product restated in a reasoning block, then the product of two other numbers
    of those digits, boxed.

    The tiny model cannot multiply 3-digit numbers, so a guess is almost never right, and a call is right when the
    model copies the factors into it and the output out of it. Every demonstration copies the factors (into the
    call or the reasoning), so the copy is learnt from all of them; the guesses owe nothing to the factors (a guess
    near the product would teach a rough product that competes with the copy of the output). Warming up on these
    leaves the model calling the tool in about 1 - noise of its samples; the reward teaches it to call it always.
    """
    product = problem.prompt.rstrip("=")
    if rng.random() < noise:
        ranges = [(10 ** (len(f) - 1) if len(f) > 1 else 0, 10 ** len(f) - 1) for f in product.split("*")]
        guess = rng.randint(*ranges[0]) * rng.randint(*ranges[1])
        return [(f"<think>{product}</think>\\boxed{{{guess}}}", True)]
    return [
        (f"```python\nprint({product})\n```", True),
        (output_block(f"{problem.answer}\n"), False),
        (f"\\boxed{{{problem.answer}}}", True),
    ]
