"""The rollout engine interface: what every sampler returns, and how a prompt becomes token ids.

An engine takes tokenized prompts and returns, per completion, its token ids (up to and including EOS),
whether it was cut at `max_completion_length`, and optionally the sampler's log-probability of each
sampled token (used for the rollout/trainer mismatch correction `is_cap`, docs/math.md §2), and, where the
engine records them (`--sampler-replay`), the set of token ids the sampler kept for each token (docs/math.md §9).
Tokens the engine put into a completion without sampling them (the thinking budget's stop sentence, a tool's
observation) are named by `InsertedSpan`s: the trainer masks them out of every term.
"""

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..batching import KeptSets

SPAN_KINDS = ("thinking", "tool")


class InsertedSpan(NamedTuple):
    """Completion positions [start, end) the engine inserted: "thinking" (the budget's stop sentence and marker) or
    "tool" (a tool's observation). A span may be empty (a thinking budget whose sentence did not fit)."""

    start: int
    end: int
    kind: str


def check_inserted(spans, n: int, where: str = "completion") -> None:
    """Raise ValueError unless `spans` are InsertedSpans of a known kind, in order, not overlapping, within [0, n)."""
    last = 0
    for span in spans:
        if not isinstance(span, InsertedSpan) or span.kind not in SPAN_KINDS:
            raise ValueError(f"{where}: inserted span {span!r} is not an InsertedSpan of kind {SPAN_KINDS}")
        if not last <= span.start <= span.end <= n:
            raise ValueError(f"{where}: inserted span {span} overlaps the one before or lies outside its {n} tokens")
        last = span.end


@dataclass
class Completion:
    prompt_ids: list[int]
    completion_ids: list[int]  # ends with EOS unless truncated
    truncated: bool  # hit max_completion_length before EOS
    logprobs: list[float] | None = None  # sampler's log-prob of each completion token
    inserted: tuple[InsertedSpan, ...] = ()  # the positions the engine inserted, not sampled, in order
    kept: KeptSets | None = None  # the sampler's kept set of each completion token (inserted ones empty), or None

    def __post_init__(self):
        if self.inserted:
            check_inserted(self.inserted, len(self.completion_ids))


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], n: int, want_logprobs: bool = False) -> list[Completion]:
        """`n` samples for each prompt, grouped: completions [i*n : (i+1)*n] belong to prompts[i]."""
        ...

    def sync_weights(self, model) -> None:
        """Make the engine sample from `model`'s current weights."""
        ...


def end_token_ids(model, tokenizer) -> list[int]:
    """The tokenizer's EOS plus the model's generation-config end tokens (chat models end turns differently)."""
    ids = [tokenizer.eos_token_id]
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += extra if isinstance(extra, (list, tuple)) else [extra]
    return sorted({i for i in ids if i is not None})


def build_prompt(tokenizer, question: str, template: str, chat: bool, max_length: int,
                 tools: tuple[dict, ...] = ()) -> list[int]:  # fmt: skip
    """Token ids of one prompt: the template filled with the question, optionally in the chat template (which lists
    `tools`, JSON schemas, where given)."""
    text = template.format(prompt=question)
    if chat:
        listed = {"tools": list(tools)} if tools else {}
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, **listed)
        if hasattr(ids, "input_ids"):  # some versions return a BatchEncoding
            ids = ids["input_ids"]
    else:
        ids = tokenizer.encode(text, add_special_tokens=True)
    return list(ids)[-max_length:]
