"""The thinking budget (Qwen3's control of chain-of-thought length) and the round-based sampling it needs.

A completion's thinking span starts after the opening marker (`<think>`): in the prompt, when the prompt's
last opening marker is not closed there (chat templates of reasoning models open it), else at the first
opening marker the completion itself writes. Once the span holds `budget` tokens without a complete
closing marker among them, the engine cuts the completion there, appends the stop-thinking sentence and
the closing marker, and lets the model write the answer after them. Only the first span is budgeted.

The inserted tokens were not sampled by the policy: a `Completion` names them (an `InsertedSpan` of kind
"thinking" in `inserted`, a [start, end) range of completion positions), they carry log-prob 0.0, and the
trainer masks them out of the loss and of the importance ratios; their kept sets are empty. A completion's kept
sets are its rounds' sets, concatenated (cut back with its tokens). Everything, inserted tokens included, stays
within `max_completion_length`.

Both engines sample in rounds (`sample_with_budget`): each round continues every unfinished completion
from its prompt plus what it has so far, at most up to where its budget could run out (`round_limit`); a
completion whose span opened inside a round and ran past the budget is cut back to the budget (`insertion`:
tokens sampled after that point are dropped, which leaves the kept tokens distributed exactly as the policy
samples them). The asynchronous rollout process (`async_worker.py`) applies the same two functions to each
completion's requests, so a seeded round k and the rollout process's piece k are the same request.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from ..batching import KeptSets
from ..validate import ConfigError
from .interface import Completion, InsertedSpan

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


def budget_spent(inserted: tuple[InsertedSpan, ...]) -> bool:
    """Whether a completion's thinking budget already ran out (its spans hold the budget's insertion)."""
    return any(span.kind == "thinking" for span in inserted)


def round_limit(prompt: list[int], ids: list[int], inserted, tb: ThinkingBudget, max_new: int) -> int:
    """Tokens a completion may sample in its next request: up to where its budget runs out, if its span is open
    (`inserted`: the completion's inserted spans so far)."""
    room = max_new - len(ids)
    s = None if budget_spent(inserted) else span_start(prompt, ids, tb)
    if s is None or find(ids, tb.end_ids, s) >= 0:
        return room
    return min(room, s + tb.budget - len(ids))


def insertion(prompt: list[int], ids: list[int], inserted, ended: bool, tb: ThinkingBudget,
              max_new: int) -> tuple[int, list[int]] | None:  # fmt: skip
    """After a request: (where to cut the completion, the tokens to insert there) when its budget ran out, else None.

    `ended`: the request's last token is an end token. An end token as the last budgeted token ends the completion
    instead. The insertion is cut short by `max_new`.
    """
    cut = None if budget_spent(inserted) else budget_cut(prompt, ids, tb)
    if cut is None or (ended and len(ids) == cut):
        return None
    return cut, list(tb.insert_ids[: max_new - cut])


@dataclass
class _Draft:
    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    inserted: tuple[InsertedSpan, ...] = ()
    kept: list[KeptSets] | None = field(default_factory=list)  # one per round; None once a round gave none
    done: bool = False
    truncated: bool = False
    rounds: int = 0  # requests sampled so far


def sample_with_budget(
    prompts: list[list[int]],
    n: int,
    tb: ThinkingBudget,
    max_new: int,
    min_new: int,
    end_ids: set[int],
    sample_round: Callable[..., list[Sampled]],
    want_logprobs: bool = False,
    seed_of: Callable[[int, int, int], int] | None = None,
) -> list[Completion]:
    """`n` completions per prompt under the thinking budget; `sample_round` samples one batch of requests.

    `seed_of(prompt index, sample, request)`, when given, seeds each request (its k-th request of a completion is
    `request`): `sample_round` is then called with the requests and their seeds, so an engine that seeds by them
    samples each completion's pieces as the rollout process (`async_worker`) does.
    """
    drafts = [_Draft(list(p)) for p in prompts for _ in range(n)]
    while active := [(i, d) for i, d in enumerate(drafts) if not d.done]:
        requests = [(d.prompt + d.ids, round_limit(d.prompt, d.ids, d.inserted, tb, max_new),
                     max(0, min_new - len(d.ids))) for _, d in active]  # fmt: skip
        if seed_of is None:
            sampled = sample_round(requests)
        else:
            sampled = sample_round(requests, [seed_of(i // n, i % n, d.rounds) for i, d in active])
        for (_, d), (new, lps, kept) in zip(active, sampled):
            d.ids += new
            d.logprobs += lps if lps is not None else [0.0] * len(new)
            d.kept = None if d.kept is None or kept is None else d.kept + [kept]
            d.rounds += 1
            ended = bool(new) and new[-1] in end_ids
            cut = insertion(d.prompt, d.ids, d.inserted, ended, tb, max_new)
            if cut is not None:
                at, insert = cut
                d.ids = d.ids[:at] + insert
                d.logprobs = d.logprobs[:at] + [0.0] * len(insert)
                if d.kept is not None:
                    d.kept = [KeptSets.cat(d.kept).head(at), KeptSets.empty(len(insert))]
                d.inserted, ended = (*d.inserted, InsertedSpan(at, at + len(insert), "thinking")), False
            d.done = ended or len(d.ids) >= max_new or not new  # (an engine that samples nothing: no loop)
            d.truncated = not ended and d.done
    return [
        Completion(d.prompt, d.ids, d.truncated, d.logprobs if want_logprobs else None, d.inserted,
                   None if d.kept is None else KeptSets.cat(d.kept))
        for d in drafts
    ]  # fmt: skip
