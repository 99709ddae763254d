"""Token-budget micro-batching and collation (padded or padding-free packed).

A micro-batch's cost is the number of token positions its forward pass touches: `rows * longest` when
padded, `sum of lengths` when packed. `plan_microbatches` keeps every micro-batch at or under the budget
(a single sequence longer than the budget gets a micro-batch of its own). Memory per forward/backward is
then set by the budget, not by G or by how many prompts the step has.

`collate` builds the model inputs plus, for the loss, index tensors that gather the hidden states
predicting each completion token into a `[n_seq, max_completion, D]` block. The loss thus always sees one
row per sequence (so per-sequence aggregation and GSPO ratios stay correct under packing) while the LM
body runs on the packed layout.
"""

from dataclasses import dataclass

import torch


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


def collate(seqs: list[Sample], packed: bool, pad_id: int) -> dict:
    """Model inputs and loss tensors for one micro-batch.

    Returns a dict with `input_ids`, `position_ids`, `attention_mask` (None when packed: the model finds
    sequence boundaries from position_ids that restart at 0; sequences of one length are packed one per
    row), `gather` `[n, Tc]` flat indices into the
    body's `[rows * width]` hidden positions (position p predicts token p + 1), `targets`, `mask`
    `[n, Tc]`, `advantages` `[n]`, and `old_logprobs` / `ref_logprobs` / `rollout_logprobs` `[n, Tc]` or None.
    """
    full = [s.prompt_ids + s.completion_ids for s in seqs]
    tc = max(len(s.completion_ids) for s in seqs)
    gather = torch.zeros((len(seqs), tc), dtype=torch.long)
    if packed and len({len(f) for f in full}) == 1:
        # Equal lengths (a group's truncated completions, say): one row per sequence is the packed layout
        # without the padding, and without a block mask; SDPA then runs its causal kernel instead of a
        # materialized [T, T] mask over the packed row (4x the attention work for two sequences, and
        # (sum of lengths)^2 mask bytes).
        width = len(full[0])
        input_ids = torch.tensor(full, dtype=torch.long)
        position_ids = torch.arange(width).expand(len(full), width)
        attention_mask = None
        starts = [i * width for i in range(len(full))]
    elif packed:
        width = sum(len(f) for f in full)
        input_ids = torch.tensor([t for f in full for t in f], dtype=torch.long).view(1, width)
        position_ids = torch.cat([torch.arange(len(f)) for f in full]).view(1, width)
        attention_mask = None
        starts, offset = [], 0
        for f in full:
            starts.append(offset)
            offset += len(f)
    else:
        width = max(len(f) for f in full)
        input_ids = _pad(full, width, pad_id, torch.long)
        position_ids = torch.arange(width).expand(len(full), width)
        attention_mask = _pad([[1] * len(f) for f in full], width, 0, torch.long)
        starts = [i * width for i in range(len(full))]
    for i, s in enumerate(seqs):
        first = starts[i] + len(s.prompt_ids) - 1  # hidden state that predicts the first completion token
        n = len(s.completion_ids)
        gather[i, :n] = torch.arange(first, first + n)
        gather[i, n:] = first  # any valid index; masked out
    mask = _pad([token_mask(s) for s in seqs], tc, 0.0, torch.float32)

    def optional(name):
        rows = [getattr(s, name) for s in seqs]
        if all(r is None for r in rows):
            return None
        if any(r is None for r in rows):
            raise ValueError(f"{name} is set for some sequences of the micro-batch but not all")
        return _pad(rows, tc, 0.0, torch.float32)

    return dict(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        gather=gather,
        targets=_pad([s.completion_ids for s in seqs], tc, 0, torch.long),
        mask=mask,
        advantages=torch.tensor([s.advantage for s in seqs], dtype=torch.float32),
        old_logprobs=optional("old_logprobs"),
        ref_logprobs=optional("ref_logprobs"),
        rollout_logprobs=optional("rollout_logprobs"),
    )
