"""The built-in tiny setup of the CPU preset: a small Llama-architecture model, a character tokenizer, and
the supervised warm-up on noisy demonstrations of the addition task (`tasks.arithmetic_problems`)."""

from .model import CharTokenizer, tiny_model
from .warmup import arithmetic_completion, noisy_demonstration, sft_warmup

__all__ = ["CharTokenizer", "arithmetic_completion", "noisy_demonstration", "sft_warmup", "tiny_model"]
