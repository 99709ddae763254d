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


def _exchange(x: torch.Tensor, group) -> torch.Tensor:
    """`[B, N, ...]`: block j of dim 1 goes to rank j, and what rank j sent lands in block j (an involution)."""
    send = x.movedim(1, 0).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.movedim(0, 1)


class _AllToAll(torch.autograd.Function):
    """The exchange is a permutation that is its own inverse, so its adjoint is itself."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _exchange(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad, ctx.group), None


def check_heads(num_heads: int, num_kv_heads: int, n: int) -> None:
    """Raise a ValueError unless N ranks can split the heads: N | heads, and N | kv heads or kv heads | N."""
    if num_heads % n:
        raise ValueError(f"sequence_parallel={n} must divide the model's {num_heads} attention heads")
    if num_kv_heads % n and n % num_kv_heads:
        raise ValueError(
            f"sequence_parallel={n} and the model's {num_kv_heads} key/value heads: one must divide the other"
        )


def _heads_to_ranks(x: torch.Tensor, n: int) -> torch.Tensor:
    """`[B, H, S, d]` → `[B, N, H / N, S, d]`, key/value heads repeated up to N first."""
    if x.shape[1] < n:
        x = x.repeat_interleave(n // x.shape[1], dim=1)
    return x.unflatten(1, (n, x.shape[1] // n))


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
    n, (batch, heads, block, _) = sp.size, query.shape
    check_heads(heads, key.shape[1], n)
    qkv = torch.cat([_heads_to_ranks(t, n) for t in (query, key, value)], dim=2)
    qkv = _AllToAll.apply(qkv, sp.group)  # [B, N(block), H' + 2·Hkv', S, d]
    qkv = qkv.movedim(1, 2).flatten(2, 3)  # [B, H' + 2·Hkv', T, d]: whole rows of this rank's heads
    kv = max(1, key.shape[1] // n)
    q, k, v = qkv.split([heads // n, kv, kv], dim=1)
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
    out = out.unflatten(2, (n, block)).movedim(2, 1)  # [B, N(block), H', S, d]
    out = _AllToAll.apply(out, sp.group)  # [B, N(head group), H', S, d]
    return out.flatten(1, 2).transpose(1, 2), None


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
