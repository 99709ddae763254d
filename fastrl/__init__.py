"""fastrl: fused, memory-bounded log-prob kernels and GRPO/PPO losses for RL post-training."""

from .kernels import token_logprobs
from .losses import GRPOLoss, LossConfig, LossOutput, grpo_loss, policy_loss

__all__ = ["token_logprobs", "GRPOLoss", "LossConfig", "LossOutput", "grpo_loss", "policy_loss"]
__version__ = "0.1.0"
