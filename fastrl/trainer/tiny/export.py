"""The tiny pair as a Hugging Face model directory, for engines that load a model from disk (vLLM).

`fast_tokenizer` builds, offline, a `PreTrainedTokenizerFast` with the character tokenizer's ids: every
markup token whole (a preset's own included), then one token per character (`<unk>` for one outside the
vocabulary, where the tokenizer has it), `<bos>` first when special tokens are added, and a decoder that joins
tokens without spaces.
"""

import re
import tempfile

from .model import MARKUP, CharTokenizer, built_in


def fast_tokenizer(tokenizer: CharTokenizer):
    """A Hugging Face fast tokenizer that encodes and decodes like `tokenizer`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    unk = None if tokenizer.unk_token_id is None else tokenizer.vocab[tokenizer.unk_token_id]
    backend = Tokenizer(models.WordLevel(vocab=dict(tokenizer.token_to_id), unk_token=unk))
    whole = [m for m in (*MARKUP, *tokenizer.markup) if len(m) > 1]
    markup = "|".join(re.escape(m) for m in sorted(whole, key=len, reverse=True))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(f"{markup}|[\\s\\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    bos = tokenizer.vocab[tokenizer.bos_token_id]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokenizer.bos_token_id)]
    )
    pad, eos = tokenizer.vocab[tokenizer.pad_token_id], tokenizer.vocab[tokenizer.eos_token_id]
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=pad, bos_token=bos, eos_token=eos,
                                   unk_token=unk)  # fmt: skip


def save_tiny(model, tokenizer: CharTokenizer, path: str) -> str:
    """Write `model` (weights and config) and the fast tokenizer to the directory `path`; returns `path`."""
    model.save_pretrained(path)
    fast_tokenizer(tokenizer).save_pretrained(path)
    return path


def model_dir(name: str, model, tokenizer) -> tuple[str, tempfile.TemporaryDirectory | None]:
    """The directory an engine that loads from disk (vLLM) reads the model `name` from: `name` itself, or for the
    built-in model (in memory only) a temporary export of `model` and `tokenizer`, returned for the caller to clean
    up (None otherwise)."""
    if not built_in(name):
        return name, None
    export = tempfile.TemporaryDirectory(prefix="fastrl-tiny-")
    return save_tiny(model, tokenizer, export.name), export
