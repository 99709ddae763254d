"""Ulysses attention (DeepSpeed-Ulysses, arXiv 2309.14509): sequence blocks in, whole sequences per head group.

Each rank of a sequence group of N holds the queries, keys and values of its block of every row, for all
heads. One all-to-all turns that into the whole row for 1/N of the heads (the sequence split becomes a
head split); attention runs there, one document at a time; a second all-to-all turns the output back.
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


def _all_to_all(send: torch.Tensor, group) -> torch.Tensor:
    """`send` `[N, ...]` contiguous: block j goes to rank j; block j of the result is what rank j sent."""
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv


def _blocks(x: torch.Tensor, n: int) -> torch.Tensor:
    """`[B, h, T, d]` whole rows → `[N, B, S, h, d]`, a view: block j holds the row's j-th S = T / N tokens."""
    return x.transpose(1, 2).unflatten(1, (n, x.shape[2] // n)).transpose(0, 1)


def _rows(recv: torch.Tensor) -> torch.Tensor:
    """`[N, B, S, h, d]` blocks → `[B, T, h, d]` whole rows: a view when B = 1, a copy otherwise."""
    n, batch, block = recv.shape[:3]
    return recv.transpose(0, 1).reshape(batch, n * block, *recv.shape[3:])


def _pack_heads(dst: torch.Tensor, x: torch.Tensor) -> None:
    """Write `x` `[B, H, S, d]` into `dst` `[N, B, S, h, d]`: block j gets head group j. With fewer heads
    than N (key/value heads under GQA) each head is written to the N / H blocks that read it."""
    n, heads = dst.shape[0], x.shape[1]
    by_rank = x.permute(1, 0, 2, 3)  # [H, B, S, d]
    if heads >= n:
        dst.copy_(by_rank.unflatten(0, (n, heads // n)).permute(0, 2, 3, 1, 4))
    else:
        dst.unflatten(0, (heads, n // heads)).copy_(by_rank[:, None, :, :, None, :])


def _unpack_heads(recv: torch.Tensor, heads: int) -> torch.Tensor:
    """The adjoint of `_pack_heads`: `[N, B, S, h, d]` → `[B, H, S, d]` (stored `[B, S, H, d]`), the blocks of
    a replicated head summed."""
    n, batch, block, _, d = recv.shape
    if heads < n:
        recv = recv.unflatten(0, (heads, n // heads)).sum(1)  # [H, B, S, 1, d]
    out = torch.empty(batch, block, heads, d, dtype=recv.dtype, device=recv.device)
    out.view(batch, block, recv.shape[0], -1, d).copy_(recv.permute(1, 2, 0, 3, 4))
    return out.transpose(1, 2)


class _SequenceToHeads(torch.autograd.Function):
    """q `[B, H, S, d]`, k and v `[B, H_kv, S, d]` of this rank's block → q, k, v `[B, h, T, d]`: the whole rows
    of this rank's heads. One send buffer and one exchange; the results are views of what was received."""

    @staticmethod
    def forward(ctx, q, k, v, group, n):
        ctx.group, ctx.n, ctx.heads = group, n, (q.shape[1], k.shape[1])
        ctx.widths = [q.shape[1] // n, max(1, k.shape[1] // n), max(1, k.shape[1] // n)]
        batch, _, block, d = q.shape
        send = q.new_empty(n, batch, block, sum(ctx.widths), d)
        for dst, x in zip(send.split(ctx.widths, dim=3), (q, k, v)):
            _pack_heads(dst, x)
        rows = _rows(_all_to_all(send, group))
        return tuple(t.transpose(1, 2) for t in rows.split(ctx.widths, dim=2))

    @staticmethod
    def backward(ctx, *grads):
        shape = _blocks(grads[0], ctx.n).shape
        send = grads[0].new_empty(*shape[:3], sum(ctx.widths), shape[4])
        for dst, g in zip(send.split(ctx.widths, dim=3), grads):
            dst.copy_(_blocks(g, ctx.n))
        recv = _all_to_all(send, ctx.group)
        heads = (ctx.heads[0], ctx.heads[1], ctx.heads[1])
        return (*(_unpack_heads(r, h) for r, h in zip(recv.split(ctx.widths, dim=3), heads)), None, None)


class _HeadsToSequence(torch.autograd.Function):
    """The attention output `[B, h, T, d]` of this rank's heads → `[B, S, H, d]` of its block, all heads."""

    @staticmethod
    def forward(ctx, out, group, n):
        ctx.group, ctx.n = group, n
        recv = _all_to_all(_blocks(out, n).contiguous(), group)  # no copy for one row stored [B, T, h, d]
        return _rows_of_heads(recv)

    @staticmethod
    def backward(ctx, grad):
        send = grad.unflatten(2, (ctx.n, grad.shape[2] // ctx.n)).permute(2, 0, 1, 3, 4).contiguous()
        return _rows(_all_to_all(send, ctx.group)).transpose(1, 2), None, None


def _rows_of_heads(recv: torch.Tensor) -> torch.Tensor:
    """`[N, B, S, h, d]` head groups → `[B, S, N·h, d]`, contiguous (the output projection's input)."""
    n, batch, block, h, d = recv.shape
    return recv.permute(1, 2, 0, 3, 4).reshape(batch, block, n * h, d)


def check_heads(num_heads: int, num_kv_heads: int, n: int) -> None:
    """Raise a ValueError unless N ranks can split the heads: N | heads, and N | kv heads or kv heads | N."""
    if num_heads % n:
        raise ValueError(f"sequence_parallel={n} must divide the model's {num_heads} attention heads")
    if num_kv_heads % n and n % num_kv_heads:
        raise ValueError(
            f"sequence_parallel={n} and the model's {num_kv_heads} key/value heads: one must divide the other"
        )


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
    batch = query.shape[0]
    check_heads(query.shape[1], key.shape[1], sp.size)
    # [B, h, T, d]: the whole rows of this rank's heads
    q, k, v = _SequenceToHeads.apply(query, key, value, sp.group, sp.size)
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
        seq_major = [p.transpose(1, 2) for p in pieces]  # [1, len, h, d], as the kernel stores its output
        rows.append(torch.cat(seq_major, dim=1) if len(pieces) > 1 else seq_major[0])
    out = (torch.cat(rows) if batch > 1 else rows[0]).transpose(1, 2)  # [B, h, T, d], stored [B, T, h, d]
    return _HeadsToSequence.apply(out, sp.group, sp.size), None


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
