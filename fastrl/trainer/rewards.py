"""The trainer's rewards: ``fastrl.rewards`` (torch-free), re-exported for ``from fastrl.trainer.rewards import``."""

from fastrl.rewards import (
    BatchRewardFn,
    CombinedReward,
    RewardFn,
    RewardScores,
    VerifierPool,
    WeightedReward,
    accuracy_reward,
    batch_accuracy_reward,
    batch_math_equal,
    combine_rewards,
    default_pool,
    extract_answer,
    format_reward,
    length_penalty,
    math_equal,
    overlong_penalty,
)

__all__ = [
    "RewardFn",
    "BatchRewardFn",
    "WeightedReward",
    "RewardScores",
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
