"""PPO/GRPO policy losses (docs/math.md §2–3): config, per-token math, exact aggregation, fused entry point."""

from fastrl.hf import head_softcap, hidden_and_head, lm_body_and_head
from fastrl.kernels import SamplerSettings

from .config import LossConfig
from .grpo import GRPOLoss, grpo_loss
from .policy import METRIC_KEYS, LossOutput, Normalizer, policy_loss

__all__ = [
    "METRIC_KEYS",
    "GRPOLoss",
    "LossConfig",
    "LossOutput",
    "Normalizer",
    "SamplerSettings",
    "grpo_loss",
    "head_softcap",
    "hidden_and_head",
    "lm_body_and_head",
    "policy_loss",
]
