"""The thinking budget (Qwen3's control of chain-of-thought length) and the round-based sampling it needs.

A completion's thinking span starts after the opening marker (`<think>`): in the prompt, when the prompt's
last opening marker is not closed there (chat templates of reasoning models open it), else at the first
opening marker the completion itself writes. Once the span holds `budget` tokens without a complete
closing marker among them, the engine cuts the completion there, appends the stop-thinking sentence and
the closing marker, and lets the model write the answer after them. Only the first span is budgeted.

The inserted tokens were not sampled by the policy: a `Completion` names them (`inserted`, a [start, end)
range of completion positions), they carry log-prob 0.0, and the trainer masks them out of the loss and
of the importance ratios; their kept sets are empty. A completion's kept sets are its rounds' sets, concatenated
(cut back with its tokens). Everything, inserted tokens included, stays within `max_completion_length`.

Both engines sample in rounds (`sample_with_budget`): each round continues every unfinished completion
from its prompt plus what it has so far, at most up to where its budget could run out; a completion
whose span opened inside a round and ran past the budget is cut back to the budget (tokens sampled after
that point are dropped, which leaves the kept tokens distributed exactly as the policy samples them).
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from ..batching import KeptSets
from ..validate import ConfigError
from .interface import Completion

# (context ids, most new tokens, fewest new tokens before an end token may be sampled)
Request = tuple[list[int], int, int]
# (new ids, ending with an end token if one was sampled, their log-probs or None, their kept sets or None)
Sampled = tuple[list[int], list[float] | None, KeptSets | None]


@dataclass(frozen=True)
class ThinkingBudget:
    budget: int  # thinking tokens a completion may produce before the engine closes its span
    start_ids: tuple[int, ...]  # the opening marker's token ids
    end_ids: tuple[int, ...]  # the closing marker's token ids
    insert_ids: tuple[int, ...]  # the stop-thinking sentence's ids, then end_ids


def thinking_budget_of(config, tokenizer) -> ThinkingBudget | None:
    """The config's thinking budget as token ids (None when off); ConfigError when it cannot fit."""
    if not config.thinking_budget:
        return None

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text, add_special_tokens=False)) if text else ()

    start, end = ids(config.think_start), ids(config.think_end)
    tb = ThinkingBudget(config.thinking_budget, start, end, ids(config.thinking_stop_text) + end)
    if not start or not end:
        raise ConfigError("think_start", config.think_start, "the thinking markers must encode to tokens")
    if tb.budget + len(tb.insert_ids) >= config.max_completion_length:
        raise ConfigError(
            "thinking_budget", tb.budget, f"plus the {len(tb.insert_ids)} inserted tokens (stop-thinking sentence "
            f"and closing marker) must leave room for an answer within max_completion_length="
            f"{config.max_completion_length}",
        )  # fmt: skip
    return tb


def find(seq: list[int], sub: tuple[int, ...], start: int = 0) -> int:
    """Index of the first occurrence of `sub` in `seq` at or after `start`, or -1."""
    n = len(sub)
    for i in range(max(start, 0), len(seq) - n + 1):
        if tuple(seq[i : i + n]) == sub:
            return i
    return -1


def span_start(prompt: list[int], completion: list[int], tb: ThinkingBudget) -> int | None:
    """The completion position where the thinking span's tokens begin (0: opened in the prompt), or None."""
    last, at = -1, find(prompt, tb.start_ids)
    while at >= 0:
        last, at = at, find(prompt, tb.start_ids, at + 1)
    if last >= 0 and find(prompt, tb.end_ids, last + len(tb.start_ids)) < 0:
        return 0
    at = find(completion, tb.start_ids)
    return None if at < 0 else at + len(tb.start_ids)


def budget_cut(prompt: list[int], completion: list[int], tb: ThinkingBudget) -> int | None:
    """The completion position where the budget runs out with the span still open (the insertion point)."""
    s = span_start(prompt, completion, tb)
    if s is None or len(completion) < s + tb.budget:
        return None
    return None if find(completion[: s + tb.budget], tb.end_ids, s) >= 0 else s + tb.budget


@dataclass
class _Draft:
    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    inserted: tuple[int, int] | None = None
    kept: list[KeptSets] | None = field(default_factory=list)  # one per round; None once a round gave none
    done: bool = False
    truncated: bool = False

    def open_budget(self, tb: ThinkingBudget, max_new: int) -> int:
        """Tokens this draft may sample next: up to where its budget runs out, if its span is open."""
        room = max_new - len(self.ids)
        s = None if self.inserted is not None else span_start(self.prompt, self.ids, tb)
        if s is None or find(self.ids, tb.end_ids, s) >= 0:
            return room
        return min(room, s + tb.budget - len(self.ids))


def sample_with_budget(
    prompts: list[list[int]],
    n: int,
    tb: ThinkingBudget,
    max_new: int,
    min_new: int,
    end_ids: set[int],
    sample_round: Callable[[list[Request]], list[Sampled]],
    want_logprobs: bool = False,
) -> list[Completion]:
    """`n` completions per prompt under the thinking budget; `sample_round` samples one batch of requests."""
    drafts = [_Draft(list(p)) for p in prompts for _ in range(n)]
    while active := [d for d in drafts if not d.done]:
        requests = [(d.prompt + d.ids, d.open_budget(tb, max_new), max(0, min_new - len(d.ids))) for d in active]
        for d, (new, lps, kept) in zip(active, sample_round(requests)):
            d.ids += new
            d.logprobs += lps if lps is not None else [0.0] * len(new)
            d.kept = None if d.kept is None or kept is None else d.kept + [kept]
            ended = bool(new) and new[-1] in end_ids
            cut = None if d.inserted is not None else budget_cut(d.prompt, d.ids, tb)
            if cut is not None and not (ended and len(d.ids) == cut):  # an end token as the last budgeted one
                insert = list(tb.insert_ids[: max_new - cut])
                d.ids = d.ids[:cut] + insert
                d.logprobs = d.logprobs[:cut] + [0.0] * len(insert)
                if d.kept is not None:
                    d.kept = [KeptSets.cat(d.kept).head(cut), KeptSets.empty(len(insert))]
                d.inserted, ended = (cut, cut + len(insert)), False
            d.done = ended or len(d.ids) >= max_new or not new  # (an engine that samples nothing: no loop)
            d.truncated = not ended and d.done
    return [
        Completion(d.prompt, d.ids, d.truncated, d.logprobs if want_logprobs else None, d.inserted,
                   None if d.kept is None else KeptSets.cat(d.kept))
        for d in drafts
    ]  # fmt: skip
