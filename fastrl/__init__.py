"""fastrl: fused, memory-bounded log-prob kernels and GRPO/PPO losses for RL post-training.

Names are imported on first use (module ``__getattr__``), so ``import fastrl.rewards`` (and a verifier worker)
loads no torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> the module that defines it
_LAZY = {
    "token_logprobs": "fastrl.kernels",
    "kept_set_from_vllm": "fastrl.kernels",
    "GRPOLoss": "fastrl.losses",
    "LossConfig": "fastrl.losses",
    "LossOutput": "fastrl.losses",
    "grpo_loss": "fastrl.losses",
    "policy_loss": "fastrl.losses",
    "lm_body_and_head": "fastrl.hf",
    "hidden_and_head": "fastrl.hf",
}
_SUBPACKAGES = ("kernels", "losses", "hf", "rewards", "trainer", "integrations", "tools")

__all__ = [
    "token_logprobs",
    "kept_set_from_vllm",
    "GRPOLoss",
    "LossConfig",
    "LossOutput",
    "grpo_loss",
    "policy_loss",
    "lm_body_and_head",
    "hidden_and_head",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBPACKAGES))
