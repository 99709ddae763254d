"""Sequence parallelism: one micro-batch's tokens split over the N ranks of a sequence group (Ulysses).

The world is data-parallel × sequence-parallel: ranks `[d·N, (d+1)·N)` form sequence group `d`, which is ONE
data-parallel replica (its ranks hold the same prompts and rollouts), and the ranks holding the same shard
of every replica form a data-parallel group. `split_microbatch` cuts each row of a collated micro-batch
(`batching.collate`: padded or packed) into N equal column blocks (the row padded to a multiple of N); rank
`r` runs the LM body on block `r` with the position ids of the WHOLE row. Inside attention (`ulysses.py`) an
all-to-all turns the sequence split into a head split, so each rank attends over the whole sequence for
1/N of the heads, and back.

The head and the loss stay local: a rank scores the completion tokens whose predicting hidden state lies
in its block, in the same one-row-per-sequence layout the loss always sees (a sequence's tokens in the
block form its row, the rest is masked). Position p predicts token p + 1 of the whole row, so the target
of a block's last position is the first token of the next block. The sampler's kept sets (docs/math.md §9)
follow their tokens: a block carries the CSR of its own tokens' sets. Every term of the loss is then a sum
over tokens divided by the step's global normalizer (docs/math.md §3), counted over the sequence group:
the ranks' losses add up to the replica's, and their gradients (summed over all ranks, as in plain data
parallelism) to its gradient. Terms that need a whole sequence (GSPO's sequence ratio, sequence-level IS,
rejection or off-policy masks, VESPO's weight, the per-sequence counts of seq-mean-token-mean, an entropy
quantile or token-mean entropy bonus) are refused (`check_token_local`).
"""

import datetime
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from fastrl.kernels import take_weight_gradient
from fastrl.losses import LossConfig
from fastrl.losses.grpo import IGNORE_INDEX

from . import distributed as dist_utils

__all__ = [
    "HeadGradientRows",
    "SequenceParallel",
    "check_same_rollouts",
    "check_token_local",
    "gather_rows",
    "group_ranks",
    "init_sequence_parallel",
    "split_microbatch",
    "step_normalizer",
]

ROW_KEYS = ("targets", "mask", "old_logprobs", "ref_logprobs", "rollout_logprobs")


@dataclass(frozen=True)
class SequenceParallel:
    """Where this rank sits in the data-parallel × sequence-parallel world."""

    size: int  # N: ranks that split one micro-batch's tokens
    rank: int  # this rank's block of every row, in [0, N)
    group: object  # the sequence group's ProcessGroup (None when N == 1: nothing to exchange)
    dp_size: int  # data-parallel replicas: world size // N
    dp_rank: int  # this rank's replica: prompt sharding and seeds follow it, not the global rank
    dp_group: object  # the ranks with this rank's block in every replica (None: the world, as torch reads it)


def _world_timeout() -> datetime.timedelta:
    """The default group's timeout, so that a rank stuck in a sequence-group collective fails as soon."""
    try:
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        return backend.options._timeout
    except (AttributeError, RuntimeError):
        return datetime.timedelta(minutes=10)


def init_sequence_parallel(size: int) -> SequenceParallel:
    """Build the sequence groups of `size` consecutive ranks and the data-parallel groups across them.

    Every rank of the world must call this (group creation is collective). `size == 1` needs no process group.

    Raises:
        ValueError: `size` not a positive int, more than 1 without a process group, or not dividing the world.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"sequence_parallel must be a positive int, got {size!r}")
    if not (dist.is_available() and dist.is_initialized()):
        if size > 1:
            raise ValueError(f"sequence_parallel={size} needs a process group: launch with torchrun")
        return SequenceParallel(1, 0, None, 1, 0, None)
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % size:
        raise ValueError(f"sequence_parallel={size} does not divide the world size {world}")
    dp_size = world // size
    if size == 1:  # every rank its own replica: the data-parallel group is the world
        return SequenceParallel(1, 0, None, world, rank, None)
    timeout = _world_timeout()
    sequence_ranks, dp_ranks = group_ranks(world, size)
    # every rank creates every group, in the same order; a data-parallel group is a real group even of one rank
    # (None would mean the world)
    groups = [dist.new_group(ranks, timeout=timeout) for ranks in sequence_ranks + dp_ranks]
    group = next(g for g, ranks in zip(groups, sequence_ranks) if rank in ranks)
    dp_group = next(g for g, ranks in zip(groups[len(sequence_ranks) :], dp_ranks) if rank in ranks)
    return SequenceParallel(size, rank % size, group, dp_size, rank // size, dp_group)


def group_ranks(world: int, size: int) -> tuple[list[list[int]], list[list[int]]]:
    """(sequence groups, data-parallel groups) as rank lists: `size` consecutive ranks split one replica's
    sequences; the ranks holding block `s` of every replica, `s, s + size, ...`, sum over the replicas."""
    sequence = [list(range(d * size, (d + 1) * size)) for d in range(world // size)]
    return sequence, [list(range(s, world, size)) for s in range(size)]


def check_token_local(config: LossConfig) -> None:
    """Refuse the loss terms that need a whole sequence on one rank (each rank holds a block of it).

    Raises:
        ValueError: naming the field and its value.
    """
    bad = {
        "loss_agg": config.loss_agg if config.loss_agg == "seq-mean-token-mean" else None,
        "ratio_level": config.ratio_level if config.ratio_level != "token" else None,
        "is_level": config.is_level if config.is_cap is not None and config.is_level != "token" else None,
        "off_policy_mask": config.off_policy_mask,
        "pg_loss": config.pg_loss if config.pg_loss == "vespo" else None,
        "top_entropy_quantile": config.top_entropy_quantile if config.top_entropy_quantile < 1 else None,
        "entropy_agg": config.entropy_agg if config.entropy_agg != "loss" and config.entropy_coef else None,
        "rejection": tuple(r for r in config.rejection if not r[0].startswith("token_")) or None,
    }
    bad = {k: v for k, v in bad.items() if v is not None}
    if bad:
        field, value = next(iter(bad.items()))
        raise ValueError(
            f"{field}={value!r} needs whole sequences on one rank; under sequence parallelism the loss must be "
            "token-local (token ratios and IS weights, token rules, token-mean / seq-mean-token-sum* / token-sum)"
        )


def _padded_width(width: int, n: int) -> int:
    return -(-width // n) * n


def _spans(gather: torch.Tensor, width: int, n: int) -> torch.Tensor:
    """`[N, n_seq, 2]`: per block and sequence, the completion columns [t0, t1) it predicts in that block."""
    t = torch.arange(gather.shape[1])
    valid = gather == gather[:, :1] + t  # collate repeats the first index past a sequence's end
    col = gather % width
    block = _padded_width(width, n) // n
    out = torch.zeros((n, gather.shape[0], 2), dtype=torch.long)
    for r in range(n):
        inside = valid & (col >= r * block) & (col < (r + 1) * block)
        count = inside.sum(1)
        first = torch.where(count > 0, inside.float().argmax(1), 0)
        out[r, :, 0], out[r, :, 1] = first, first + count
    return out


def _shard_positions(position_ids: torch.Tensor, sp: SequenceParallel, block: int) -> torch.Tensor:
    width = position_ids.shape[1]
    pad = _padded_width(width, sp.size) - width
    # padding continues the last sequence of the row: after every real token, so causally invisible to them
    full = torch.cat([position_ids, position_ids[:, -1:] + torch.arange(1, pad + 1)], 1)
    return full[:, sp.rank * block : (sp.rank + 1) * block]


def _shard_labels(input_ids: torch.Tensor, sp: SequenceParallel, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This block's input ids and labels: position p's label is token p + 1 of the whole row."""
    width = input_ids.shape[1]
    full = torch.cat([input_ids, input_ids.new_zeros(input_ids.shape[0], _padded_width(width, sp.size) - width)], 1)
    ids = full[:, sp.rank * block : (sp.rank + 1) * block]
    labels = torch.cat([full[:, 1:], full.new_full((full.shape[0], 1), IGNORE_INDEX)], 1)
    return ids, labels[:, sp.rank * block : (sp.rank + 1) * block]


def split_microbatch(mb: dict, sp: SequenceParallel) -> dict:
    """This rank's block of a collated micro-batch, in `collate`'s format (the update runs it unchanged).

    Args:
        mb: `batching.collate`'s dict; with an attention mask, rows must be right-padded.
        sp: this rank's place (`init_sequence_parallel`).

    Returns:
        A dict with `input_ids` / `position_ids` `[rows, W']` (W' = ⌈W / N⌉, positions of the whole row),
        `attention_mask` None (right padding is causally invisible to real tokens), `gather` `[n, T']` into
        the block's `rows·W'` hidden states, `targets`, `mask`, the optional log-probs `[n, T']` (the
        completion tokens this block predicts, left-aligned; the rest masked), `advantages` `[n]`, the kept
        sets' `kept_ids` / `kept_offsets` / `kept_missing` of those tokens (`_split_kept`; Nones without sets),
        and `spans` `[N, n, 2]` (every block's completion columns, for `gather_rows`).

    Raises:
        ValueError: an attention mask that is not right padding.
    """
    mask2d = mb.get("attention_mask")
    if mask2d is not None and bool((mask2d[:, 1:] > mask2d[:, :-1]).any()):
        raise ValueError("sequence parallelism needs right-padded rows: the attention mask has a 0 before a 1")
    rows, width = mb["input_ids"].shape
    block = _padded_width(width, sp.size) // sp.size
    ids, labels = _shard_labels(mb["input_ids"], sp, block)
    spans = _spans(mb["gather"], width, sp.size)
    t0, t1 = spans[sp.rank, :, 0], spans[sp.rank, :, 1]
    t_local = max(1, int((t1 - t0).max()) if len(t0) else 1)
    j = torch.arange(t_local)
    live = j < (t1 - t0)[:, None]  # [n, T']
    cols = (t0[:, None] + j).clamp(max=mb["gather"].shape[1] - 1)
    flat = mb["gather"].gather(1, cols)
    local = torch.where(live, (flat // width) * block + flat % width - sp.rank * block, 0)
    out = dict(
        input_ids=ids,
        position_ids=_shard_positions(mb["position_ids"], sp, block),
        attention_mask=None,
        gather=local,
        targets=torch.where(live, labels.reshape(-1)[local], 0),
        advantages=mb["advantages"],
        spans=spans,
    )
    for key in ROW_KEYS[1:]:
        out[key] = None if mb[key] is None else torch.where(live, mb[key].gather(1, cols), 0.0)
    out.update(_split_kept(mb, live, cols))
    return out


def _split_kept(mb: dict, live: torch.Tensor, cols: torch.Tensor) -> dict:
    """The block's part of the micro-batch's kept sets (docs/math.md §9): the CSR of its `[n, T']` rows, the ids
    of its tokens only and the offsets rebased to them, and its tokens' `kept_missing` flags (each token on one
    rank, so the step's sum counts it once). Three Nones when the micro-batch carries no sets."""
    if mb.get("kept_ids") is None:
        return dict(kept_ids=None, kept_offsets=None, kept_missing=None)
    whole = mb["kept_offsets"]
    tokens = (torch.arange(cols.shape[0])[:, None] * mb["targets"].shape[1] + cols).reshape(-1)
    counts = torch.where(live.reshape(-1), whole.diff()[tokens], 0)
    offsets = torch.zeros(counts.numel() + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=offsets[1:])
    total = int(offsets[-1])
    owner = torch.repeat_interleave(torch.arange(counts.numel()), counts, output_size=total)
    source = whole[tokens][owner] + torch.arange(total) - offsets[owner]  # id j of token k: its place in the whole
    missing = torch.where(live, mb["kept_missing"].gather(1, cols), False)
    return dict(kept_ids=mb["kept_ids"][source], kept_offsets=offsets, kept_missing=missing)


def gather_rows(values: torch.Tensor, shard: dict, sp: SequenceParallel) -> torch.Tensor:
    """The whole micro-batch's `[n, T]` per-token values from every block's `[n, T']` (no gradient).

    Every rank of the sequence group must call it; positions no block predicts (past a sequence's end) are 0.
    """
    spans = shard["spans"]
    width = int(spans[..., 1].max())
    if sp.size == 1:
        return values[:, :width]
    counts = spans[..., 1] - spans[..., 0]  # [N, n]
    t_max = max(1, int(counts.max()))
    local = values.new_zeros(values.shape[0], t_max)
    local[:, : values.shape[1]] = values[:, :t_max]
    parts = [torch.empty_like(local) for _ in range(sp.size)]
    dist.all_gather(parts, local.contiguous(), group=sp.group)
    out = values.new_zeros(values.shape[0], width)
    for r, part in enumerate(parts):
        for i in range(values.shape[0]):
            t0, t1 = spans[r, i].tolist()
            out[i, t0:t1] = part[i, : t1 - t0]
    return out


def step_normalizer(shards: list[dict], loss_agg: str, live_sequences: int, sp: SequenceParallel) -> float:
    """The step's global normalizer (docs/math.md §3) from this rank's blocks, counted over the sequence group.

    token-mean: the live tokens of this rank's blocks, summed over the sequence group (whose blocks
    partition the replica's tokens) and the data-parallel group. Otherwise: `live_sequences`, this replica's
    sequences that carry loss (the same on every rank of its group), summed over the data-parallel group.
    """
    count_tokens = loss_agg == "token-mean"
    local = float(sum(float(s["mask"].sum()) for s in shards)) if count_tokens else float(live_sequences)
    if count_tokens and sp.size > 1:
        local = dist_utils.all_reduce_sum(local, sp.group)
    return dist_utils.all_reduce_sum(local, sp.dp_group)


def check_same_rollouts(samples: list, sp: SequenceParallel) -> None:
    """Raise unless every rank of the sequence group holds the same samples (they split the same sequences).

    Raises:
        RuntimeError: naming the checksums, e.g. after a resume with another sequence-parallel size.
    """
    if sp.size == 1:
        return
    text = repr([(s.prompt_ids, s.completion_ids, s.advantage, s.loss_mask, s.token_mask, s.kept is None)
                 for s in samples])  # fmt: skip
    crc = zlib.crc32(text.encode())
    for s in samples:  # the kept sets the loss replays (docs/math.md §9), as their bytes
        if s.kept is not None:
            crc = zlib.crc32(s.kept.ids.numpy().tobytes(), zlib.crc32(s.kept.counts.numpy().tobytes(), crc))
    mine = float(crc)
    low, high = -dist_utils.all_reduce_max(-mine, sp.group), dist_utils.all_reduce_max(mine, sp.group)
    if low != high:
        raise RuntimeError(
            f"the ranks of a sequence group hold different rollouts (checksums {low:.0f} .. {high:.0f}): they must "
            "sample with the same seed (the data-parallel rank's) from the same weights"
        )


class HeadGradientRows:
    """The head weight's gradient summed over the sequence group, this rank's block of its rows only.

    The gradient-in-forward loss forms the head's `[V, D]` weight gradient in its forward pass, and every rank
    of the group would hold its own until the backward ends. Summed over the group right away instead (one
    reduce-scatter: a part of the sum the step's all-reduce forms anyway), a rank holds V / N rows through the
    backward. `add_to` then adds them to the weight's gradient (other ranks add the other rows), and the
    step's all-reduce over the world completes the sum, as it does for every other gradient.
    """

    def __init__(self, sp: SequenceParallel):
        self.sp, self.rows = sp, None

    def take(self, loss: torch.Tensor) -> None:
        """After each micro-batch's loss, before its backward, on every rank of the group.

        Raises:
            RuntimeError: the group's ranks disagree on whether their losses hold a head gradient.
        """
        d_weight = take_weight_gradient(loss)
        holders = dist_utils.all_reduce_sum(float(d_weight is not None), self.sp.group)
        if holders == 0:
            return  # a frozen head, or a loss that forms no gradient in its forward pass
        if d_weight is None or holders != self.sp.size:
            raise RuntimeError(f"{holders:.0f} of the sequence group's {self.sp.size} losses hold a head gradient")
        blocks, group = list(torch.tensor_split(d_weight, self.sp.size)), self.sp.group
        if d_weight.dtype == torch.float32:
            mine = torch.empty_like(blocks[self.sp.rank])
            dist.reduce_scatter(mine, blocks, group=group)
        else:  # summed in float32 as the step's all-reduce sums gradients: one float32 block at a time
            for j, block in enumerate(blocks):
                total = block.float()
                dist.reduce(total, dst=dist.get_global_rank(group, j), group=group)
                if j == self.sp.rank:
                    mine = total
        del d_weight, blocks
        self.rows = mine if self.rows is None else self.rows.add_(mine)

    def add_to(self, weight: torch.Tensor) -> None:
        """Add this rank's rows to `weight.grad` (zeros first if it has none), before the step's all-reduce."""
        if self.rows is None:
            return
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        torch.tensor_split(weight.grad, self.sp.size)[self.sp.rank].add_(self.rows.to(weight.grad.dtype))
        self.rows = None
