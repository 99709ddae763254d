"""Verifiable rewards for math RL: answer correctness, format, length shaping, and their weighted combination.

Torch-free: importing this package loads neither torch nor sympy (sympy runs only in the verifier workers).
The rewards and how they enter the advantage are in docs/math.md §4; the verifier is described in docs/rewards.md.

    from fastrl.rewards import accuracy_reward, combine_rewards, format_reward

    reward = combine_rewards([(accuracy_reward, 1.0), (format_reward, 0.1)])
    scores = reward.score(completions, golds)  # scores.total, scores.per_fn
"""

from .accuracy import accuracy_reward, batch_accuracy_reward, batch_math_equal, math_equal
from .combine import BatchRewardFn, CombinedReward, RewardFn, RewardScores, WeightedReward, combine_rewards
from .extract import extract_answer, gold_answer
from .pool import VerifierPool, default_pool
from .shaping import format_reward, length_penalty, overlong_penalty

__all__ = [
    "RewardFn",
    "BatchRewardFn",
    "WeightedReward",
    "RewardScores",
    "CombinedReward",
    "combine_rewards",
    "extract_answer",
    "gold_answer",
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
