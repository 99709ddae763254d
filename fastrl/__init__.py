"""fastrl: fused, memory-bounded log-prob kernels and GRPO/PPO losses for RL post-training."""

from .kernels import token_logprobs

__all__ = ["token_logprobs"]
__version__ = "0.1.0"
