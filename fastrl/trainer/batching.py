"""Token-budget micro-batching and collation (padded or padding-free packed).

A micro-batch's cost is the number of token positions its forward pass touches: `rows * longest` when
padded, `sum of lengths` when packed. `plan_microbatches` keeps every micro-batch at or under the budget
(a single sequence longer than the budget gets a micro-batch of its own). Memory per forward/backward is
then set by the budget, not by G or by how many prompts the step has.

`collate` builds the model inputs plus, for the loss, index tensors that gather the hidden states
predicting each completion token into a `[n_seq, max_completion, D]` block. The loss thus always sees one
row per sequence (so per-sequence aggregation and GSPO ratios stay correct under packing) while the LM
body runs on the packed layout.

With the sampler's kept sets (`Sample.kept`, docs/math.md §9) `collate` also builds their CSR over the
flattened `[n, Tc]` rows (padding rows empty) and leaves out of the loss, and counts, a token whose target is
not in its row's set.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KeptSets:
    """The sampler's kept set of each completion token (docs/math.md §9), CSR-ready.

    Token t's set is `ids[start_t : start_t + counts[t]]` with `start_t = counts[:t].sum()`. Both int32: a token
    whose sampler kept |S| ids costs 4·|S| + 4 bytes (top-k 50: at most 204 bytes; ties at the cutoff can widen a
    set). A token the policy did not sample (the thinking budget's inserted ones) has an empty set.
    """

    ids: torch.Tensor  # [M] int32: every token's kept ids, token after token, in any order within a token
    counts: torch.Tensor  # [T] int32: how many ids each completion token kept

    def __post_init__(self):
        for name in ("ids", "counts"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1:
                raise TypeError(f"KeptSets.{name} must be a 1-D int32 tensor, got {getattr(t, 'dtype', type(t))}")
        if self.counts.numel() and int(self.counts.min()) < 0:
            raise ValueError(f"KeptSets.counts must be >= 0, got {int(self.counts.min())}")
        if int(self.counts.sum()) != self.ids.numel():
            raise ValueError(f"KeptSets.counts sum to {int(self.counts.sum())} but ids holds {self.ids.numel()}")

    @classmethod
    def of(cls, sets) -> "KeptSets":
        """From one sequence of kept ids per token (lists, tensors, ...)."""
        sets = [torch.as_tensor(s, dtype=torch.int32).reshape(-1) for s in sets]
        ids = torch.cat(sets) if sets else torch.zeros(0, dtype=torch.int32)
        return cls(ids, torch.tensor([s.numel() for s in sets], dtype=torch.int32))

    @classmethod
    def empty(cls, n: int) -> "KeptSets":
        """`n` tokens with empty sets (tokens the policy did not sample)."""
        return cls(torch.zeros(0, dtype=torch.int32), torch.zeros(n, dtype=torch.int32))

    @classmethod
    def cat(cls, parts: list["KeptSets"]) -> "KeptSets":
        """The sets of consecutive pieces of one completion, in order."""
        if not parts:
            return cls.empty(0)
        return cls(torch.cat([p.ids for p in parts]), torch.cat([p.counts for p in parts]))

    def head(self, n: int) -> "KeptSets":
        """The sets of the first `n` tokens."""
        return KeptSets(self.ids[: int(self.counts[:n].sum())], self.counts[:n].clone())

    def __len__(self) -> int:
        return self.counts.numel()


@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    loss_mask: bool = True  # False: kept for metrics but contributes no loss (e.g. masked truncation)
    old_logprobs: list[float] | None = None
    ref_logprobs: list[float] | None = None
    rollout_logprobs: list[float] | None = None
    token_mask: list[float] | None = None  # per completion token: 0.0 = not sampled by the policy (None: all 1)
    kept: KeptSets | None = None  # the sampler's kept set of each completion token: replayed by the loss

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


def plan_microbatches(lengths: list[int], budget: int, packed: bool) -> list[list[int]]:
    """Group sequence indices into micro-batches of cost <= budget, longest first.

    Sorting by length keeps padding low; the greedy fill is first-fit in that order.
    """
    if budget < 1:
        raise ValueError(f"max_tokens_per_microbatch must be >= 1, got {budget}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_sum = cur_max = 0
    for i in order:
        n = lengths[i]
        cost = cur_sum + n if packed else (len(cur) + 1) * max(cur_max, n)
        if cur and cost > budget:
            batches.append(cur)
            cur, cur_sum, cur_max = [], 0, 0
        cur.append(i)
        cur_sum, cur_max = cur_sum + n, max(cur_max, n)
    if cur:
        batches.append(cur)
    return batches


def microbatch_cost(lengths: list[int], packed: bool) -> int:
    return sum(lengths) if packed else len(lengths) * max(lengths, default=0)


def token_mask(s: Sample) -> list[float]:
    """The loss mask of a sample's completion tokens: 0 everywhere when masked, else its token mask."""
    if not s.loss_mask:
        return [0.0] * len(s.completion_ids)
    return [1.0] * len(s.completion_ids) if s.token_mask is None else s.token_mask


def _pad(rows: list[list[float]], width: int, value: float, dtype) -> torch.Tensor:
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def _layout(full: list[list[int]], packed: bool, pad_id: int):
    """(input_ids, position_ids, attention_mask, each sequence's first flat position) of the model's input."""
    if packed and len({len(f) for f in full}) > 1:
        width = sum(len(f) for f in full)
        input_ids = torch.tensor([t for f in full for t in f], dtype=torch.long).view(1, width)
        position_ids = torch.cat([torch.arange(len(f)) for f in full]).view(1, width)
        starts = torch.tensor([0] + [len(f) for f in full[:-1]]).cumsum(0).tolist()
        return input_ids, position_ids, None, starts
    width = max(len(f) for f in full)
    position_ids = torch.arange(width).expand(len(full), width)
    starts = [i * width for i in range(len(full))]
    if packed:
        # Equal lengths (a group's truncated completions, say): one row per sequence is the packed layout
        # without the padding, and without a block mask; SDPA then runs its causal kernel instead of a
        # materialized [T, T] mask over the packed row (4x the attention work for two sequences, and
        # (sum of lengths)^2 mask bytes).
        return torch.tensor(full, dtype=torch.long), position_ids, None, starts
    attention_mask = _pad([[1] * len(f) for f in full], width, 0, torch.long)
    return _pad(full, width, pad_id, torch.long), position_ids, attention_mask, starts


def _optional_rows(seqs: list[Sample], name: str, tc: int) -> torch.Tensor | None:
    """The samples' per-token `name` (log-probs) as `[n, Tc]`, or None when no sample has them."""
    rows = [getattr(s, name) for s in seqs]
    if all(r is None for r in rows):
        return None
    if any(r is None for r in rows):
        raise ValueError(f"{name} is set for some sequences of the micro-batch but not all")
    return _pad(rows, tc, 0.0, torch.float32)


def collate(seqs: list[Sample], packed: bool, pad_id: int) -> dict:
    """Model inputs and loss tensors for one micro-batch.

    Returns a dict with `input_ids`, `position_ids`, `attention_mask` (None when packed: the model finds
    sequence boundaries from position_ids that restart at 0; sequences of one length are packed one per
    row), `gather` `[n, Tc]` flat indices into the
    body's `[rows * width]` hidden positions (position p predicts token p + 1), `targets`, `mask`
    `[n, Tc]`, `advantages` `[n]`, `old_logprobs` / `ref_logprobs` / `rollout_logprobs` `[n, Tc]` or None, and
    `kept_ids` `[M]` int32 / `kept_offsets` `[n·Tc + 1]` int64 (the kept sets' CSR over the flattened rows, padding
    rows empty) with `kept_missing` `[n, Tc]` bool (a live token whose target is not in its set: its mask is 0),
    or three Nones when the samples carry no kept sets.
    """
    full = [s.prompt_ids + s.completion_ids for s in seqs]
    input_ids, position_ids, attention_mask, starts = _layout(full, packed, pad_id)
    tc = max(len(s.completion_ids) for s in seqs)
    gather = torch.zeros((len(seqs), tc), dtype=torch.long)
    for i, s in enumerate(seqs):
        first = starts[i] + len(s.prompt_ids) - 1  # hidden state that predicts the first completion token
        n = len(s.completion_ids)
        gather[i, :n] = torch.arange(first, first + n)
        gather[i, n:] = first  # any valid index; masked out
    mask = _pad([token_mask(s) for s in seqs], tc, 0.0, torch.float32)
    targets = _pad([s.completion_ids for s in seqs], tc, 0, torch.long)
    kept_ids, kept_offsets, missing = kept_csr(seqs, tc, targets, mask)
    if missing is not None:
        mask = mask.masked_fill(missing, 0.0)
    return dict(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        gather=gather,
        targets=targets,
        mask=mask,
        advantages=torch.tensor([s.advantage for s in seqs], dtype=torch.float32),
        old_logprobs=_optional_rows(seqs, "old_logprobs", tc),
        ref_logprobs=_optional_rows(seqs, "ref_logprobs", tc),
        rollout_logprobs=_optional_rows(seqs, "rollout_logprobs", tc),
        kept_ids=kept_ids,
        kept_offsets=kept_offsets,
        kept_missing=missing,
    )


def kept_csr(seqs: list[Sample], tc: int, targets: torch.Tensor, mask: torch.Tensor):
    """(kept_ids `[M]` int32, kept_offsets `[n·Tc + 1]` int64, missing `[n, Tc]` bool) of the micro-batch's
    kept sets, or (None, None, None) when no sample has them; `missing`: mask != 0 and the target not in the set.
    """
    if all(s.kept is None for s in seqs):
        return None, None, None
    counts = torch.zeros(len(seqs), tc, dtype=torch.int64)
    for i, s in enumerate(seqs):
        if s.kept is None:
            raise ValueError("kept sets are given for some sequences of the micro-batch but not all")
        if len(s.kept) != len(s.completion_ids):
            raise ValueError(f"a sample has {len(s.kept)} kept sets for {len(s.completion_ids)} completion tokens")
        counts[i, : len(s.kept)] = s.kept.counts
    ids = torch.cat([s.kept.ids for s in seqs])
    offsets = torch.zeros(counts.numel() + 1, dtype=torch.int64)
    torch.cumsum(counts.reshape(-1), 0, out=offsets[1:])
    rows = torch.repeat_interleave(torch.arange(counts.numel()), counts.reshape(-1), output_size=ids.numel())
    found = torch.zeros(counts.numel(), dtype=torch.bool)
    found[rows[ids.long() == targets.reshape(-1)[rows]]] = True
    missing = (mask != 0) & ~found.view_as(mask)
    return ids, offsets, missing
