"""The built-in tiny causal LM and character-level tokenizer: the CPU preset needs no downloads.

The tokenizer maps one character to one id, plus a few multi-character tokens for the markup the rewards
read (`<think>`, `</think>`, `\\boxed{`), so a completion like `\\boxed{42}` costs 4 tokens, not 10.
It offers the small slice of the Hugging Face tokenizer interface the trainer uses (`encode`, `decode`,
`batch_decode`, `pad_token_id`, `eos_token_id`), so rollouts and updates treat it like any other.

A preset may declare markup of its own (`tiny_tokens`: the tool format's fences, say); those tokens come after
the built-in vocabulary, so every built-in id stays what it is. A run with tools also gets `<unk>`, the token of
any character outside the vocabulary: a tool's output is text the model did not choose.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SPECIALS = ("<pad>", "<bos>", "<eos>")
MARKUP = ("<think>", "</think>", "\\boxed{")
CHARS = "0123456789+-*/=()[]{}<>.,:;?!'\"_^\\ \nabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


UNKNOWN = "<unk>"  # the token of a character outside the vocabulary (runs with tools only)
TINY = "tiny"  # the name `config.model` gives the built-in model


def built_in(name: str) -> bool:
    """Whether the model named `name` is the built-in tiny one (built in memory, nothing to download): the one
    test every special case of it goes through."""
    return name == TINY


class CharTokenizer:
    """Character-level tokenizer with a handful of multi-character markup tokens.

    Args:
        markup: tokens of their own after the built-in vocabulary (ids from `len(CharTokenizer())` on), each a
            string not already a token.
        unknown: give characters outside the vocabulary the token `<unk>` (after `markup`); without it such a
            character is a ValueError.
    """

    def __init__(self, markup: tuple[str, ...] = (), unknown: bool = False):
        builtin = list(SPECIALS) + list(MARKUP) + list(CHARS)
        for i, token in enumerate(markup):
            if not isinstance(token, str) or not token:
                raise ValueError(f"markup token {i} must be a non-empty str, got {token!r}")
            if token in builtin or token == UNKNOWN or token in markup[:i]:
                raise ValueError(f"markup token {token!r} is already a token of the tiny vocabulary")
        self.markup = tuple(markup)
        self.vocab = builtin + list(self.markup) + ([UNKNOWN] if unknown else [])
        self.token_to_id = {t: i for i, t in enumerate(self.vocab)}
        self.pad_token_id, self.bos_token_id, self.eos_token_id = 0, 1, 2
        self.unk_token_id = self.token_to_id[UNKNOWN] if unknown else None
        # longest markup first so "</think>" is not read as "<" + "/think>"...
        self._markup = sorted((*MARKUP, *(t for t in self.markup if len(t) > 1)), key=len, reverse=True)

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
                if ch in self.token_to_id:
                    ids.append(self.token_to_id[ch])
                elif self.unk_token_id is not None:
                    ids.append(self.unk_token_id)
                else:
                    raise ValueError(f"character {ch!r} at position {i} of {text!r} is not in the tiny vocabulary")
                i += 1
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        out = []
        for i in ids:
            if not 0 <= i < len(self.vocab):
                raise ValueError(f"token id {i} is outside the tiny vocabulary [0, {len(self.vocab)})")
            if skip_special_tokens and (i < len(SPECIALS) or i == self.unk_token_id):  # as Hugging Face's do
                continue
            out.append(self.vocab[i])
        return "".join(out)

    def batch_decode(self, batch, skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids, skip_special_tokens=skip_special_tokens) for ids in batch]


def tiny_tokenizer(config) -> CharTokenizer:
    """The built-in model's tokenizer for `config`: its preset's `tiny_tokens`, and `<unk>` when tools run."""
    return CharTokenizer(tuple(config.tiny_tokens), unknown=bool(config.tools))


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
