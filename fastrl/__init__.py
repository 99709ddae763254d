"""fastrl: fused, memory-bounded log-prob kernels and GRPO/PPO losses for RL post-training."""

from .kernels import token_logprobs
from .losses import GRPOLoss, LossConfig, LossOutput, grpo_loss, hidden_and_head, lm_body_and_head, policy_loss

__all__ = [
    "token_logprobs",
    "GRPOLoss",
    "LossConfig",
    "LossOutput",
    "grpo_loss",
    "policy_loss",
    "lm_body_and_head",
    "hidden_and_head",
]
__version__ = "0.1.0"
