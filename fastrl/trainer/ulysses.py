"""Ulysses attention (DeepSpeed-Ulysses, arXiv 2309.14509): sequence blocks in, whole sequences per head group.

Each rank of a sequence group of N holds the queries, keys and values of its block of every row, for all
heads. All-to-alls turn that into the whole row for 1/N of the heads (the sequence split becomes a
head split); attention runs there, one document at a time; the reverse exchange turns the output back. The
exchanges run one head of every head group at a time, each received into its place in the result, so
besides its input and output an exchange holds one head's buffers, not a copy of every head (nor does its
backward, the same exchanges reversed).
Key/value heads are replicated up to N when there are fewer (GQA): rank r's query heads all read the same
key/value head, so N must be a multiple of the key/value heads, or divide them.

The attention function is registered through transformers' `AttentionInterface` and switched on only
inside `ulysses(model, sp)`, around the update's forward AND backward passes (a checkpointed layer reruns
its forward in the backward). HF `generate` called inside it runs with the model's own attention.
Documents are found from the position ids of the whole row (gathered over the group): a document starts
where the position does not continue the previous one (packed rows restart at 0). Each document runs as
its own causal SDPA call, so no `[T, T]` mask over a packed row is ever built. Right padding continues the
last document, after every real token, so it changes none of their outputs.
"""

from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .sequence_parallel import SequenceParallel

__all__ = ["ATTENTION", "check_heads", "ulysses"]

ATTENTION = "fastrl_ulysses"
_active: list[SequenceParallel] = []  # the group of the `ulysses` context this process is in


def _all_to_all(dst: torch.Tensor, src: torch.Tensor, group) -> None:
    """`dst[j]` = what rank j holds in its `src[this rank]`, both `[N, ...]`; straight into `dst` when it is
    contiguous (a batch of one row), else through a buffer of its size."""
    src = src.contiguous()
    if dst.is_contiguous():
        dist.all_to_all_single(dst, src, group=group)
        return
    buf = torch.empty_like(src)
    dist.all_to_all_single(buf, src, group=group)
    dst.copy_(buf)


def _blocks_to_heads(x: torch.Tensor, n: int, group) -> torch.Tensor:
    """`[B, H, S, d]` of this rank's block → `[B, H / N, N·S, d]`, whole rows of this rank's heads.

    One head of every head group at a time, written into the output as it arrives: the only transients are
    that head's send (and receive, for more than one row) buffers, not a copy of every head."""
    batch, heads, block, d = x.shape
    y = x.new_empty(batch, heads // n, n * block, d)
    groups = x.unflatten(1, (n, heads // n))  # [B, N(head group), H / N, S, d]
    for c in range(heads // n):
        _all_to_all(y[:, c].unflatten(1, (n, block)).movedim(1, 0), groups[:, :, c].movedim(1, 0), group)
    return y


def _heads_to_blocks(y: torch.Tensor, n: int, group) -> torch.Tensor:
    """The inverse of `_blocks_to_heads`: `[B, H / N, N·S, d]` → `[B, H, S, d]`."""
    batch, local, length, d = y.shape
    x = y.new_empty(batch, n * local, length // n, d)
    groups = x.unflatten(1, (n, local))
    for c in range(local):
        _all_to_all(groups[:, :, c].movedim(1, 0), y[:, c].unflatten(1, (n, length // n)).movedim(1, 0), group)
    return x


class _ToHeads(torch.autograd.Function):
    """Sequence blocks → head groups for each tensor; the exchange is a permutation, so its adjoint is the
    inverse exchange."""

    @staticmethod
    def forward(ctx, n, group, *xs):
        ctx.n, ctx.group = n, group
        return tuple(_blocks_to_heads(x, n, group) for x in xs)

    @staticmethod
    def backward(ctx, *grads):
        return None, None, *(None if g is None else _heads_to_blocks(g, ctx.n, ctx.group) for g in grads)


class _ToBlocks(torch.autograd.Function):
    """Head groups → sequence blocks (the attention output), the adjoint of `_ToHeads`."""

    @staticmethod
    def forward(ctx, n, group, y):
        ctx.n, ctx.group = n, group
        return _heads_to_blocks(y, n, group)

    @staticmethod
    def backward(ctx, grad):
        return None, None, _blocks_to_heads(grad, ctx.n, ctx.group)


def check_heads(num_heads: int, num_kv_heads: int, n: int) -> None:
    """Raise a ValueError unless N ranks can split the heads: N | heads, and N | kv heads or kv heads | N."""
    if num_heads % n:
        raise ValueError(f"sequence_parallel={n} must divide the model's {num_heads} attention heads")
    if num_kv_heads % n and n % num_kv_heads:
        raise ValueError(
            f"sequence_parallel={n} and the model's {num_kv_heads} key/value heads: one must divide the other"
        )


def _replicate_heads(x: torch.Tensor, n: int) -> torch.Tensor:
    """`[B, H, S, d]` with its key/value heads repeated up to N when there are fewer."""
    return x.repeat_interleave(n // x.shape[1], dim=1) if x.shape[1] < n else x


def _documents(position_ids: torch.Tensor, sp: SequenceParallel, batch: int) -> list[list[tuple[int, int]]]:
    """Per row, the [start, end) spans of its documents in the whole row (the group's gathered positions)."""
    parts = [torch.empty_like(position_ids) for _ in range(sp.size)]
    dist.all_gather(parts, position_ids.contiguous(), group=sp.group)
    pos = torch.cat(parts, dim=-1).expand(batch, -1).cpu()
    new = torch.ones_like(pos, dtype=torch.bool)
    new[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    out = []
    for row in new:
        starts = row.nonzero().flatten().tolist() + [row.numel()]
        out.append(list(zip(starts[:-1], starts[1:])))
    return out


def ulysses_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The `AttentionInterface` function: `query` `[B, H, S, d]`, `key` / `value` `[B, H_kv, S, d]` of this
    rank's block; returns `[B, S, H, d]` and no weights."""
    if not _active:
        raise RuntimeError(f"the {ATTENTION!r} attention runs only inside `ulysses(model, sp)`")
    sp = _active[-1]
    if attention_mask is not None or kwargs.get("sliding_window") is not None:
        raise ValueError("sequence-parallel attention takes no attention mask and no sliding window")
    position_ids = kwargs.get("position_ids")
    if position_ids is None or query.shape[2] != key.shape[2]:
        raise ValueError("sequence-parallel attention needs the position ids of whole rows and no KV cache")
    n, (batch, heads) = sp.size, query.shape[:2]
    check_heads(heads, key.shape[1], n)
    q, k, v = _ToHeads.apply(n, sp.group, *(_replicate_heads(t, n) for t in (query, key, value)))
    drop = dropout if module.training else 0.0
    rows = []
    for b, docs in enumerate(_documents(position_ids, sp, batch)):
        pieces = [
            F.scaled_dot_product_attention(
                q[b : b + 1, :, s:e],
                k[b : b + 1, :, s:e],
                v[b : b + 1, :, s:e],
                dropout_p=drop,
                is_causal=True,
                scale=scaling,
                enable_gqa=True,
            )
            for s, e in docs
        ]
        rows.append(torch.cat(pieces, dim=2) if len(pieces) > 1 else pieces[0])
    out = torch.cat(rows, dim=0) if batch > 1 else rows[0]  # [B, H', T, d]
    return _ToBlocks.apply(n, sp.group, out).transpose(1, 2), None  # [B, S, H, d]


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, ulysses_attention)


@contextmanager
def ulysses(model, sp: SequenceParallel):
    """Run `model`'s attention sequence-parallel over `sp` within the block (forward and backward passes).

    Raises:
        ValueError: the heads do not split over `sp.size` ranks (`check_heads`).
    """
    if sp.size == 1:
        yield model
        return
    config = model.config
    heads = config.num_attention_heads
    check_heads(heads, getattr(config, "num_key_value_heads", None) or heads, sp.size)
    _register()
    own = config._attn_implementation
    generate = model.__dict__.get("generate")

    def plain_generate(*args, **kwargs):
        config._attn_implementation = own
        try:
            return type(model).generate(model, *args, **kwargs) if generate is None else generate(*args, **kwargs)
        finally:
            config._attn_implementation = ATTENTION

    config._attn_implementation = ATTENTION
    model.generate = plain_generate
    _active.append(sp)
    try:
        yield model
    finally:
        _active.pop()
        config._attn_implementation = own
        if generate is None:
            del model.generate
        else:
            model.generate = generate
