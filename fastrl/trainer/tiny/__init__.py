"""The built-in tiny setup of the CPU preset: a small Llama-architecture model, a character tokenizer,
the noisy demonstrations of the addition task the supervised warm-up trains on (`tasks.arithmetic_problems`), and the
export of the pair to a Hugging Face model directory (for vLLM)."""

from .export import fast_tokenizer, model_dir, save_tiny
from .model import CharTokenizer, built_in, tiny_model, tiny_tokenizer
from .warmup import arithmetic_completion, noisy_demonstration

__all__ = [
    "CharTokenizer",
    "arithmetic_completion",
    "built_in",
    "fast_tokenizer",
    "model_dir",
    "noisy_demonstration",
    "save_tiny",
    "tiny_model",
    "tiny_tokenizer",
]
