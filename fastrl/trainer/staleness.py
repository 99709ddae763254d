"""Asynchronous rollouts: which policy version sampled each token, and which rollout groups may train.

Versions count optimizer steps: the weights after `v` steps are version `v`, the rollout engine starts on
version 0 and is sent version `v` right after optimizer step `v`. A completion records the versions that
sampled it as spans over its token indexes (vLLM's `CompletionOutput.weight_versions`, stitched across the
pieces of a partial rollout). At an optimizer step the trainer holds version `v`; a token sampled by version
`u` is `v - u` versions stale. The admission rule (docs/math.md §10): a group trains only if the oldest token
of any of its completions is at most K versions stale; otherwise it is dropped, counted, and its prompt is
sampled again.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class VersionSpan:
    version: int  # the policy version (optimizer steps taken) that sampled tokens [start, end)
    start: int
    end: int


@dataclass
class RolloutGroup:
    """The G completions of one prompt, each with its per-token behaviour log-probs and version spans."""

    prompt_id: int  # the prompt's position in the run's prompt stream: unique for the whole run
    prompt_ids: list[int]
    completion_ids: list[list[int]]
    logprobs: list[list[float]]  # the sampler's processed log-prob of each completion token
    spans: list[tuple[VersionSpan, ...]]  # per completion, covering [0, len(completion_ids[i]))
    truncated: list[bool]  # per completion: cut at the length limit before an end token
    meta: dict = field(default_factory=dict)
    # per completion, with `--sampler-replay`: the sampler's kept sets as NumPy int32 arrays (ids [M], counts [T]),
    # the pieces of a partial rollout concatenated in order (`batching.KeptSets` once received); None without
    kept: list[tuple] | None = None
    # per completion: the spans the engine inserted, not sampled (`rollout.interface.InsertedSpan`s); None: none
    inserted: list[tuple] | None = None

    def __post_init__(self):
        n = len(self.completion_ids)
        if not (len(self.logprobs) == len(self.spans) == len(self.truncated) == n) or n == 0:
            raise ValueError(
                f"group {self.prompt_id}: {n} completions but {len(self.logprobs)} log-prob lists, "
                f"{len(self.spans)} span lists, {len(self.truncated)} truncation flags"
            )
        for ids, lps, spans in zip(self.completion_ids, self.logprobs, self.spans):
            if len(lps) != len(ids):
                raise ValueError(f"group {self.prompt_id}: {len(ids)} tokens but {len(lps)} log-probs")
            check_spans(spans, len(ids))
        if self.kept is not None:
            if len(self.kept) != n:
                raise ValueError(f"group {self.prompt_id}: {n} completions but {len(self.kept)} kept-set records")
            for ids, (kept_ids, counts) in zip(self.completion_ids, self.kept):
                if len(counts) != len(ids) or int(counts.sum()) != len(kept_ids):
                    raise ValueError(f"group {self.prompt_id}: {len(ids)} tokens but kept sets for {len(counts)} "
                                     f"tokens holding {int(counts.sum())} ids of {len(kept_ids)}")  # fmt: skip
        if self.inserted is not None:
            if len(self.inserted) != n:
                raise ValueError(f"group {self.prompt_id}: {n} completions but {len(self.inserted)} inserted spans")
            from .rollout.interface import check_inserted  # (the rollout package's own import runs this module)

            for ids, spans in zip(self.completion_ids, self.inserted):
                check_inserted(spans, len(ids), f"group {self.prompt_id}")

    @property
    def oldest_version(self) -> int:
        """The version that sampled the group's oldest token (a completion with no tokens counts none)."""
        versions = [s.version for spans in self.spans for s in spans if s.end > s.start]
        if not versions:
            raise ValueError(f"group {self.prompt_id} has no sampled token")
        return min(versions)


def check_spans(spans: Sequence[VersionSpan], n_tokens: int) -> None:
    """ValueError unless `spans` tile [0, n_tokens) in order, each non-empty, with a version >= 0."""
    pos = 0
    for s in spans:
        if s.start != pos or s.end <= s.start or s.version < 0:
            raise ValueError(f"version spans {list(spans)} do not tile [0, {n_tokens}) (at token {pos})")
        pos = s.end
    if pos != n_tokens:
        raise ValueError(f"version spans {list(spans)} do not tile [0, {n_tokens}) (end at {pos})")


def parse_spans(weight_versions, n_tokens: int, fallback: int) -> tuple[VersionSpan, ...]:
    """vLLM's `weight_versions` ([(version str, start, end)]) as spans of int versions.

    A label that is not an integer ("default": no version set yet) or a missing list (vLLM reported no
    label) is read as `fallback`, the version the caller knows the engine held.
    """
    if not weight_versions:
        return (VersionSpan(fallback, 0, n_tokens),) if n_tokens else ()
    spans = []
    for w in weight_versions:
        version = int(w.version) if str(w.version).isdigit() else fallback
        if w.end > w.start:
            spans.append(VersionSpan(version, w.start, w.end))
    spans = merge_spans(spans)
    check_spans(spans, n_tokens)
    return spans


def merge_spans(spans: Iterable[VersionSpan]) -> tuple[VersionSpan, ...]:
    """Adjacent spans of one version joined into one."""
    out: list[VersionSpan] = []
    for s in spans:
        if out and out[-1].version == s.version and out[-1].end == s.start:
            out[-1] = VersionSpan(s.version, out[-1].start, s.end)
        else:
            out.append(s)
    return tuple(out)


def head_spans(spans: Sequence[VersionSpan], n: int) -> tuple[VersionSpan, ...]:
    """The spans of the first `n` tokens."""
    return tuple(VersionSpan(s.version, s.start, min(s.end, n)) for s in spans if s.start < n)


def stitch(pieces: Sequence[tuple[VersionSpan, ...]], lengths: Sequence[int]) -> tuple[VersionSpan, ...]:
    """The spans of a completion generated in pieces: piece k's spans shifted by the tokens before it."""
    shifted, offset = [], 0
    for spans, n in zip(pieces, lengths, strict=True):
        check_spans(spans, n)
        shifted += [VersionSpan(s.version, s.start + offset, s.end + offset) for s in spans]
        offset += n
    return merge_spans(shifted)


def token_versions(spans: Sequence[VersionSpan]) -> list[int]:
    """The version of each token, expanded from its spans."""
    return [s.version for s in spans for _ in range(s.start, s.end)]


def admitted(group: RolloutGroup, trainer_version: int, max_staleness: int) -> bool:
    """The admission rule: the group's oldest token is at most `max_staleness` versions behind the trainer."""
    if max_staleness < 0:
        raise ValueError(f"async_staleness must be >= 0, got {max_staleness}")
    oldest = group.oldest_version
    if oldest > trainer_version:
        raise ValueError(
            f"group {group.prompt_id} sampled by version {oldest}, after trainer version {trainer_version}"
        )
    return trainer_version - oldest <= max_staleness


def admit(groups: Iterable[RolloutGroup], trainer_version: int, max_staleness: int):
    """(admitted groups, dropped groups), each in the order given."""
    kept, dropped = [], []
    for g in groups:
        (kept if admitted(g, trainer_version, max_staleness) else dropped).append(g)
    return kept, dropped


def staleness_stats(groups: Iterable[RolloutGroup], trainer_version: int) -> dict:
    """`staleness_mean`, `staleness_max` over every completion token of `groups`, in versions at `trainer_version`."""
    total = count = worst = 0
    for g in groups:
        for spans in g.spans:
            for s in spans:
                lag = trainer_version - s.version
                total, count, worst = total + lag * (s.end - s.start), count + s.end - s.start, max(worst, lag)
    return {"staleness_mean": total / count if count else 0.0, "staleness_max": float(worst)}
