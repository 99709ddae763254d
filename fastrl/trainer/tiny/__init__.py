"""The built-in tiny setup of the CPU preset: a small Llama-architecture model, a character tokenizer,
the supervised warm-up on noisy demonstrations of the addition task (`tasks.arithmetic_problems`), and the
export of the pair to a Hugging Face model directory (for vLLM)."""

from .export import fast_tokenizer, save_tiny
from .model import CharTokenizer, tiny_model
from .warmup import arithmetic_completion, noisy_demonstration, sft_warmup

__all__ = [
    "CharTokenizer",
    "arithmetic_completion",
    "fast_tokenizer",
    "noisy_demonstration",
    "save_tiny",
    "sft_warmup",
    "tiny_model",
]
