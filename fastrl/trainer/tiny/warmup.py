"""The tiny task's demonstrations for the supervised warm-up (`trainer/warmup.py` trains on them).

Warming up on demonstrations that are right only some of the time leaves the model with a partial skill
(it knows the format and puts some probability on the right sum), which GRPO then sharpens from rewards.
"""

import random


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
