"""What every rollout engine is built from: `(model, tokenizer, config)`, read the same way by each."""

from .engine import end_token_ids
from .thinking import thinking_budget_of

__all__ = ["SamplingEngine"]


class SamplingEngine:
    """The sampler settings both engines take from a `TrainConfig`: lengths, temperature, top-p / top-k / min-p,
    end tokens and the thinking budget (ConfigError when the budget cannot fit, before an engine starts)."""

    def __init__(self, model, tokenizer, config):
        self.tokenizer = tokenizer
        self.max_new_tokens, self.min_new_tokens = config.max_completion_length, config.min_completion_length
        self.temperature, self.top_p = config.temperature, config.top_p
        self.top_k, self.min_p = config.top_k, config.min_p  # top_k 0: off
        self.eos_ids = end_token_ids(model, tokenizer)  # the tokenizer's EOS and the model's end-of-turn tokens
        self.thinking = thinking_budget_of(config, tokenizer)
