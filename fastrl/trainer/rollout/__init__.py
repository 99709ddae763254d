"""Rollouts: sample G completions per prompt with the Hugging Face engine or a colocated vLLM engine.

`interface.py` holds the interface (`Completion`, `InsertedSpan`, `RolloutEngine`) and prompt building,
`sampling.py` what both engines are built from (`SamplingEngine(model, tokenizer, config)`: the config's sampler
settings), `hf_engine.py` the `model.generate` engine, `vllm_engine.py` the vLLM one (imported only when chosen),
`thinking.py` the thinking budget both engines apply.
"""

import importlib.util

import torch

from .hf_engine import HFEngine, trim_completion
from .interface import Completion, InsertedSpan, RolloutEngine, build_prompt
from .sampling import SamplingEngine
from .thinking import ThinkingBudget, budget_cut, thinking_budget_of

__all__ = [
    "Completion",
    "HFEngine",
    "InsertedSpan",
    "RolloutEngine",
    "SamplingEngine",
    "ThinkingBudget",
    "budget_cut",
    "build_prompt",
    "check_engine_available",
    "make_engine",
    "thinking_budget_of",
    "trim_completion",
]


def check_engine_available(name: str) -> None:
    """Fail before a model is built when `name` is "vllm" and vLLM is not importable."""
    spec = importlib.util.find_spec("vllm") if name == "vllm" else None
    if name == "vllm" and (spec is None or spec.origin is None):  # no origin: a namespace folder, not vLLM
        raise ImportError("engine='vllm' needs vLLM: pip install 'fastrl[vllm]' (GPU) or see docs/trainer.md (CPU)")


def make_engine(name: str, model, tokenizer, config) -> RolloutEngine:
    """The rollout engine for `config.engine` ("auto" picks vLLM when installed and on CUDA)."""
    if name == "auto":
        name = "hf"
        if torch.cuda.is_available() and next(model.parameters()).is_cuda:
            try:
                import vllm  # noqa: F401

                name = "vllm"
            except ImportError:
                pass
    if name == "vllm":
        from .vllm_engine import VLLMEngine

        return VLLMEngine(model, tokenizer, config)
    if name == "hf":
        return HFEngine(model, tokenizer, config)
    raise ValueError(f"unknown rollout engine {name!r}; use 'auto', 'hf' or 'vllm'")
