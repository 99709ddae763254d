"""The built-in tiny causal LM and character-level tokenizer: the CPU preset needs no downloads.

The tokenizer maps one character to one id, plus a few multi-character tokens for the markup the rewards
read (`<think>`, `</think>`, `\\boxed{`), so a completion like `\\boxed{42}` costs 4 tokens, not 10.
It offers the small slice of the Hugging Face tokenizer interface the trainer uses (`encode`, `decode`,
`batch_decode`, `pad_token_id`, `eos_token_id`), so rollouts and updates treat it like any other.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SPECIALS = ("<pad>", "<bos>", "<eos>")
MARKUP = ("<think>", "</think>", "\\boxed{")
CHARS = "0123456789+-*/=()[]{}<>.,:;?!'\"_^\\ \nabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


TINY = "tiny"  # the name `config.model` gives the built-in model


def built_in(name: str) -> bool:
    """Whether the model named `name` is the built-in tiny one (built in memory, nothing to download): the one
    test every special case of it goes through."""
    return name == TINY


class CharTokenizer:
    """Character-level tokenizer with a handful of multi-character markup tokens."""

    def __init__(self):
        self.vocab = list(SPECIALS) + list(MARKUP) + list(CHARS)
        self.token_to_id = {t: i for i, t in enumerate(self.vocab)}
        self.pad_token_id, self.bos_token_id, self.eos_token_id = 0, 1, 2
        # longest markup first so "</think>" is not read as "<" + "/think>"...
        self._markup = sorted(MARKUP, key=len, reverse=True)

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = [self.bos_token_id] if add_special_tokens else []
        i = 0
        while i < len(text):
            for m in self._markup:
                if text.startswith(m, i):
                    ids.append(self.token_to_id[m])
                    i += len(m)
                    break
            else:
                ch = text[i]
                if ch not in self.token_to_id:
                    raise ValueError(f"character {ch!r} at position {i} of {text!r} is not in the tiny vocabulary")
                ids.append(self.token_to_id[ch])
                i += 1
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        out = []
        for i in ids:
            if not 0 <= i < len(self.vocab):
                raise ValueError(f"token id {i} is outside the tiny vocabulary [0, {len(self.vocab)})")
            if i < len(SPECIALS) and skip_special_tokens:
                continue
            out.append(self.vocab[i])
        return "".join(out)

    def batch_decode(self, batch, skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids, skip_special_tokens=skip_special_tokens) for ids in batch]


def tiny_model(
    vocab_size: int, hidden_size: int = 128, num_layers: int = 2, num_heads: int = 4, max_len: int = 64, seed: int = 0
) -> LlamaForCausalLM:
    """A randomly initialised Llama-architecture causal LM (tied embeddings) small enough for 2 CPU cores."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 3,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_len,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)
