"""Vocab-parallel token log-probs: the LM head split over the ranks of a process group by rows.

Rank r holds rows [lo_r, lo_r + V_r) of the `[V, D]` weight (rank order, any sizes, e.g.
`W.tensor_split(P)[r]`) and the FULL hidden states and targets. It computes, over its own columns only,
three per-token partials: the max m_r, s_r = Σ exp(z − m_r) and t_r = Σ exp(z − m_r)(z − m_r), plus the
target logit where it owns the target (0 elsewhere). Two all-reduces of O(N) floats combine them
(docs/math.md §6): M = max_r m_r, then the sums of exp(m_r − M)·s_r, of the target logits and of
exp(m_r − M)·(t_r + (m_r − M)·s_r); lse = M + log S and H = log S − T / S, as the single-device kernels
merge their vocab splits (fwd.py). Backward is the single-device backward restricted to this rank's columns,
with the global lse and entropy: d_weight and d_bias stay local, d_hidden is all-reduced (summed). The final
logits are §8's, z = softcap(h·W + b) / τ: the cap is elementwise, so each rank caps its own columns, and a
per-token τ divides each row (the Triton kernels' row scale).
Per-rank memory is O(N + chunk · V_r); nothing of size N · V is built or sent.

Locally, targets are renumbered: an owned target y becomes y − lo_r, a target owned elsewhere becomes
V_r (a column no tile has, so no one-hot and no target logit here) and an ignored row becomes −1, so the
local kernels run unchanged with ignore_index = −1.
"""

import dataclasses

import torch
import torch.distributed as dist

from ..autograd import differentiable_once
from ..logits import logit_tile, no_autocast
from .chunked import chunk_rows
from .params import LogprobParams, SampledLogprobs
from .sampled import sampled_backward

__all__ = ["resolve_shard", "shard_layout", "token_logprobs_vocab_parallel", "vocab_parallel_path"]

_M_INIT = -1e30  # the partial max of an empty shard: exp(m − M) is then 0, never NaN


def shard_layout(local_rows: int, group, device: torch.device) -> tuple[int, int]:
    """(first row of this rank's shard, full vocabulary V), from every rank's row count (one all-gather)."""
    sizes = torch.zeros(dist.get_world_size(group), dtype=torch.int64, device=device)
    mine = torch.tensor([local_rows], dtype=torch.int64, device=device)
    dist.all_gather_into_tensor(sizes, mine, group=group)
    sizes = sizes.tolist()
    r = dist.get_rank(group)
    return sum(sizes[:r]), sum(sizes)


def local_targets(targets: torch.Tensor, lo: int, rows: int, ignore_index: int) -> torch.Tensor:
    """Targets in this shard's numbering: own ids − lo, others' ids → rows, ignored → −1 (int64)."""
    valid = targets != ignore_index
    owned = valid & (targets >= lo) & (targets < lo + rows)
    loc = torch.where(owned, targets - lo, torch.full_like(targets, rows))
    return torch.where(valid, loc, torch.full_like(targets, -1)).long()


def _live_rows(hidden, valid, sl):
    # Ignored rows are often padding whose hidden state may be inf/NaN: zero them (a [C, D] copy, small next to
    # the [C, V] tile) so no 0·NaN reaches the statistics
    return torch.where(valid[sl].unsqueeze(-1), hidden[sl], 0.0)


def _partials_torch(hidden, weight, loc, bias, tau, params: LogprobParams):
    # (m, s, t or None, target logit) per token over this shard's columns, in [C, V_r] tiles
    n, dev = hidden.shape[0], hidden.device
    m = torch.full((n,), _M_INIT, dtype=torch.float32, device=dev)
    s = torch.zeros(n, dtype=torch.float32, device=dev)
    t = torch.zeros(n, dtype=torch.float32, device=dev) if params.return_entropy else None
    z_target = torch.zeros(n, dtype=torch.float32, device=dev)
    rows = weight.shape[0]
    if rows == 0 or n == 0:
        return m, s, t, z_target
    valid, owned = loc >= 0, (loc >= 0) & (loc < rows)
    safe = torch.where(owned, loc, 0)
    step = chunk_rows(rows)
    for start in range(0, n, step):
        sl = slice(start, min(n, start + step))
        tau_c = tau[sl] if isinstance(tau, torch.Tensor) else tau
        z = logit_tile(_live_rows(hidden, valid, sl), weight, bias, softcap=params.softcap, tau=tau_c)
        c_m = z.amax(-1)
        m[sl] = c_m
        z_target[sl] = torch.where(owned[sl], z.gather(-1, safe[sl].unsqueeze(-1)).squeeze(-1), 0.0)
        z.sub_(c_m.unsqueeze(-1))  # z − m
        p = z.exp()
        s[sl] = p.sum(-1)
        if t is not None:
            t[sl] = p.mul_(z).sum(-1)
    return m, s, t, z_target


def _row_scale(tau):
    return tau.reciprocal() if isinstance(tau, torch.Tensor) else None  # with params.temperature = 1


def _partials_triton(hidden, weight, loc, bias, tau, params: LogprobParams):
    from .fwd import logprob_partials

    if weight.shape[0] == 0 or hidden.shape[0] == 0:
        return _partials_torch(hidden, weight, loc, bias, tau, params)
    part_m, part_s, part_t, z_target = logprob_partials(hidden, weight, loc, bias, params, row_scale=_row_scale(tau))
    # fold the kernel's vocab splits into one partial per token, as `merge_partials` does
    m = part_m.amax(0)
    scale = torch.exp(part_m - m)
    s = (scale * part_s).sum(0)
    t = None if part_t is None else (scale * (part_t + (part_m - m) * part_s)).sum(0)
    return m, s, t, z_target


def _combine(m, s, t, z_target, valid, group):
    """Per-rank partials → (logp, lse, entropy or None), identical on every rank (two all-reduces)."""
    big_m = m.clone()
    dist.all_reduce(big_m, op=dist.ReduceOp.MAX, group=group)
    scale = torch.exp(m - big_m)
    parts = [scale * s, z_target] + ([] if t is None else [scale * (t + (m - big_m) * s)])
    sums = torch.stack(parts)
    dist.all_reduce(sums, group=group)
    log_s = torch.log(sums[0])
    lse = big_m + log_s
    zero = torch.zeros((), dtype=torch.float32, device=lse.device)
    logp = torch.where(valid, sums[1] - lse, zero)
    entropy = None if t is None else torch.where(valid, log_s - sums[2] / sums[0], zero)
    return logp, lse, entropy


@dataclasses.dataclass(frozen=True)
class _Shard:
    group: object  # the process group
    impl: str  # "triton" or "torch"
    first_row: int  # this rank's first row of the head


def _forward(hidden, weight, targets, bias, tau, params, shard: _Shard):
    loc = local_targets(targets, shard.first_row, weight.shape[0], params.ignore_index)
    local = dataclasses.replace(params, ignore_index=-1)
    partials = _partials_triton if shard.impl == "triton" else _partials_torch
    with no_autocast(hidden):
        m, s, t, z_target = partials(hidden, weight, loc, bias, tau, local)
        logp, lse, entropy = _combine(m, s, t, z_target, loc >= 0, shard.group)
    return logp, lse, entropy, loc, local


class VocabParallelLogprobFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, bias, tau, params: LogprobParams, shard: _Shard):
        logp, lse, entropy, loc, local = _forward(hidden, weight, targets, bias, tau, params, shard)
        ctx.params, ctx.group, ctx.impl, ctx.tau = local, shard.group, shard.impl, tau
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(hidden, weight, loc, bias, lse, entropy)
        return logp if entropy is None else (logp, entropy)

    @staticmethod
    @differentiable_once  # the backward is hand-written: a second derivative must raise, not be wrong
    def backward(ctx, grad_logp, *grad_rest):
        hidden, weight, loc, bias, lse, entropy = ctx.saved_tensors
        grad_entropy = grad_rest[0] if grad_rest else None
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[3]
        d_hidden = d_weight = d_bias = None
        if weight.shape[0] == 0:
            d_hidden = torch.zeros_like(hidden) if need_h else None
            d_weight = torch.zeros_like(weight) if need_w else None
            d_bias = torch.zeros_like(bias) if need_b else None
        elif ctx.impl == "triton" and hidden.shape[0] > 0:
            from .bwd import logprob_backward

            d_hidden, d_weight, d_bias = logprob_backward(
                hidden, weight, loc, bias, (lse, entropy, None, _row_scale(ctx.tau)), (grad_logp, grad_entropy),
                ctx.params, (need_h, need_w, need_b),
            )  # fmt: skip
        else:
            # §8's backward with nothing dropped (θ = −inf): it takes the cap and a per-row τ; the global lse whole
            minus_inf = torch.full_like(lse, float("-inf"))
            stats = torch.stack([lse, torch.zeros_like(lse), torch.zeros_like(lse) if entropy is None else entropy,
                                 minus_inf])  # fmt: skip
            with no_autocast(hidden):
                d_hidden, d_weight, d_bias = sampled_backward(
                    hidden, weight, loc, bias, (ctx.tau, stats), (grad_logp, grad_entropy), ctx.params,
                    (need_h, need_w, need_b),
                )  # fmt: skip
        if need_h:
            # every rank must join the all-reduce, whichever gradients it formed
            d_hidden = torch.zeros_like(hidden) if d_hidden is None else d_hidden
            dist.all_reduce(d_hidden, group=ctx.group)
        return d_hidden, d_weight, None, d_bias, None, None, None


def resolve_shard(weight, bias, process_group):
    """(local weight, local bias, group) of a vocab-parallel call; a DTensor weight must be Shard(0) on 1 dim."""
    from torch.distributed.tensor import DTensor, Shard

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("process_group was given but torch.distributed is not initialized")
    if not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(
            f"process_group must be a torch.distributed ProcessGroup or None, got {type(process_group).__name__}"
        )
    if dist.get_rank(process_group) < 0:
        raise ValueError("this rank is not a member of process_group")
    if isinstance(weight, DTensor):
        mesh = weight.device_mesh
        if mesh.ndim != 1 or tuple(weight.placements) != (Shard(0),):
            raise ValueError(
                f"a DTensor weight must be sharded on dim 0 of a 1-D mesh, got placements {weight.placements}"
            )
        if dist.get_process_group_ranks(mesh.get_group()) != dist.get_process_group_ranks(process_group):
            raise ValueError("the DTensor weight's mesh and process_group hold different ranks")
        weight = weight.to_local()
    if isinstance(bias, DTensor):
        bias = bias.to_local()
    return weight, bias, process_group


def token_logprobs_vocab_parallel(hidden, weight, targets, bias, params: LogprobParams, group, impl: str, lo: int):
    """`[N, D]`, this rank's `[V_r, D]` rows from row `lo`, `[N]` full-vocabulary ids, `[V_r]` | None;
    params.temperature a float or `[N]` float32 (tau below), params.softcap the cap.

    Returns logp `[N]` and entropy `[N]` (or None), float32, equal on every rank of `group`.
    """
    tau, shard = params.temperature, _Shard(group, impl, lo)
    if isinstance(tau, torch.Tensor):  # the per-row τ rides apart from the kernels' scalar one
        params = dataclasses.replace(params, temperature=1.0)
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in (hidden, weight, bias)):
        logp, _, entropy, _, _ = _forward(hidden, weight, targets, bias, tau, params, shard)
        return logp, entropy
    out = VocabParallelLogprobFunction.apply(hidden, weight, targets, bias, tau, params, shard)
    return (out, None) if isinstance(out, torch.Tensor) else out


def vocab_parallel_path(c) -> SampledLogprobs:
    """The vocab-parallel path of a checked log-prob call (api.py's `_Call`)."""
    hidden = c.hidden if c.hidden.dtype == c.weight.dtype else c.hidden.to(c.weight.dtype)
    logp, entropy = token_logprobs_vocab_parallel(
        hidden, c.weight, c.targets, c.bias, c.params, c.group, c.impl, c.first_row
    )
    return SampledLogprobs(logp, entropy, None, None, None)
