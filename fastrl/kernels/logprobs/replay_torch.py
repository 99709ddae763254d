"""The replay walk in PyTorch: log-probs over the sampler's kept sets, O(M·D) work for M kept pairs (§9).

Every sum runs in an order fixed by what is summed, never by N, the chunking or a thread count: a dot over D is
a pairwise tree of elementwise adds (`tree_dot`); a sum over a segment of pairs (a row's set, or the pairs of
one token id) is one `embedding_bag` bag, which adds its entries in order, alone (`bag_sum`); maxima are exact.
So two identical calls agree bit for bit, and a row's outputs do not depend on the other rows. No scatter with
float accumulation is used: d_weight sums the pairs sorted by token id (stably), one bag per token.

Gathers of weight and hidden rows run in chunks of pairs sized by a fixed byte budget (`pair_chunk`).
"""

import warnings

import torch
import torch.nn.functional as F

from ..budgets import replay_pair_bytes
from .kept_set import KeptSet

__all__ = [
    "final_logits",
    "pair_chunk",
    "replay_backward_torch",
    "replay_forward_torch",
    "row_stats",
    "bag_sum",
    "id_segments",
    "row_sums",
    "token_offsets",
    "tree_dot",
]


def pair_chunk(d: int) -> int:
    """Pairs per chunk: one float32 `[pairs, D]` buffer is about `replay_pair_bytes()` (configs.py), a fixed
    workspace (never scaled by N) of which a handful live at once."""
    return max(16, replay_pair_bytes() // (4 * max(d, 1)))


def tree_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise dots of `[M, D]` float32 tensors, `[M]`: a product, then halving adds (a fixed pairwise tree)."""
    x = a * b
    width = x.shape[1]
    while width > 1:
        half, odd = width // 2, width % 2
        x[:, :half] += x[:, half : 2 * half]
        if odd:
            x[:, half] = x[:, width - 1]
        width = half + odd
    return x[:, 0] if x.shape[1] else x.new_zeros(x.shape[0])


def bag_sum(table, idx, offsets, weights) -> torch.Tensor:
    """`[B, D]` float32: Σ_j weights[j]·table[idx[j]] over each bag j ∈ [offsets[b], offsets[b + 1]).

    Each bag is one `embedding_bag` sum, which walks its entries in order, alone (on the CPU and on CUDA): a
    bag's sum does not depend on the other bags. A float32 table is read in place (the output is the only
    allocation); a half-precision table's rows are gathered and upcast in chunks of `pair_chunk` pairs, and a
    bag split over chunks adds its pieces in chunk order.
    """
    if table.dtype == torch.float32:
        return F.embedding_bag(idx, table, offsets, mode="sum", per_sample_weights=weights, include_last_offset=True)
    m = idx.shape[0]
    out = torch.zeros(offsets.shape[0] - 1, table.shape[1], dtype=torch.float32, device=table.device)
    step = pair_chunk(table.shape[1])
    for p0 in range(0, m, step):
        p1 = min(m, p0 + step)
        b0, b1 = (torch.searchsorted(offsets, offsets.new_tensor([p0, p1 - 1]), right=True) - 1).tolist()
        local = offsets[b0 : b1 + 2].clamp(p0, p1) - p0
        rows = table.index_select(0, idx[p0:p1]).float()
        ix = torch.arange(p1 - p0, device=idx.device)
        out[b0 : b1 + 1] += F.embedding_bag(
            ix, rows, local, mode="sum", per_sample_weights=weights[p0:p1], include_last_offset=True
        )
    return out


def row_sums(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """`[N]` float32 sums of `[M]` values over the CSR rows, each a bag sum (see `bag_sum`)."""
    ones = torch.ones(1, 1, dtype=torch.float32, device=values.device)
    idx = torch.zeros(values.shape[0], dtype=torch.int64, device=values.device)
    return bag_sum(ones, idx, offsets, values)[:, 0]


def token_offsets(sorted_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """`[V + 1]` int64: where each token id's run starts in the sorted ids (its bag of pairs; empty if absent)."""
    return torch.searchsorted(sorted_ids, torch.arange(vocab + 1, device=sorted_ids.device))


def id_segments(sorted_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The runs of sorted token ids: (each run's id `[U]`, run starts `[U + 1]` int64, the last = M)."""
    seg_ids, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
    seg_starts = torch.zeros(seg_ids.shape[0] + 1, dtype=torch.int64, device=sorted_ids.device)
    torch.cumsum(counts, 0, out=seg_starts[1:])
    return seg_ids, seg_starts


def final_logits(x: torch.Tensor, scale: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """z = softcap(x)·scale: the raw logits `x` of pairs and their rows' scales (1/τ, or row_scale/τ)."""
    if softcap is not None:
        x = torch.tanh(x / softcap) * softcap
    return x * scale


def _pair_logits(hidden, weight, bias, ids, rows, offsets) -> torch.Tensor:
    """x[j] = h[rows[j]]·W[ids[j]] + b[ids[j]], float32, `[M]`, for the CSR pairs (`offsets` `[N + 1]`).

    A float32 head on the CPU takes torch's sampled matmul (`sampled_addmm`: one dot per pair, in place, nothing
    gathered, each dot a vectorized reduction over D alone, sets in any order). Elsewhere (a half-precision head,
    or CUDA, whose sparse library may assume sorted sets) the rows are gathered and upcast in chunks of
    `pair_chunk` pairs and each dot is a `tree_dot` (float32 sums of the products).
    """
    m, d = ids.shape[0], weight.shape[1]
    if m == 0:
        return torch.zeros(0, dtype=torch.float32, device=hidden.device)
    if weight.dtype == torch.float32 and hidden.device.type == "cpu":
        with warnings.catch_warnings():  # "sparse CSR support is in beta": the one op used here is tested
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            pattern = torch.sparse_csr_tensor(
                offsets, ids, torch.zeros(m, dtype=torch.float32, device=hidden.device),
                size=(hidden.shape[0], weight.shape[0]), check_invariants=False,
            )  # fmt: skip
        x = torch.sparse.sampled_addmm(pattern, hidden.float().contiguous(), weight.T, beta=0.0).values()
    else:
        x = torch.empty(m, dtype=torch.float32, device=hidden.device)
        step = pair_chunk(d)
        for start in range(0, m, step):
            sl = slice(start, min(m, start + step))
            w = weight.index_select(0, ids[sl]).float()
            h = hidden.index_select(0, rows[sl]).float()
            x[sl] = tree_dot(h, w)
    if bias is not None:
        x += bias.index_select(0, ids).float()
    return x


def row_stats(z: torch.Tensor, rows: torch.Tensor, offsets: torch.Tensor):
    """Per-row (max, log Σ exp(z − max), Σ exp(z − max)(z − max) / Σ exp(z − max)) of pairs' logits, `[N]` each
    (an empty row: −inf, 0, 0)."""
    n = offsets.shape[0] - 1
    row_max = torch.full((n,), float("-inf"), dtype=torch.float32, device=z.device)
    row_max.scatter_reduce_(0, rows, z, "amax")  # a max is exact in any order
    zc = z - row_max[rows]
    e = torch.exp(zc)
    s = row_sums(e, offsets)
    t = row_sums(torch.where(e > 0, e * zc, 0.0), offsets)  # a −inf logit (a banned token) adds 0, not NaN
    s = torch.where(s > 0, s, 1.0)
    return row_max, s.log(), t / s


def replay_forward_torch(hidden, weight, bias, targets, scale, kept: KeptSet, params, missing_x):
    """(logp `[N]`, lse `[N]`, entropy `[N]`, x `[M]`): the forward over the kept pairs, with `params`' soft-cap
    and ignore_index (replay.py's ReplayParams).

    `missing_x`: the raw target logits of rows whose target is outside their set (`[n_missing]`), from
    `missing_target_logits`; logp there is still z_y − log Σ_S exp z.
    """
    softcap, ignore_index = params.softcap, params.ignore_index
    n = targets.shape[0]
    x = _pair_logits(hidden, weight, bias, kept.ids, kept.rows, kept.offsets)
    z = final_logits(x, scale[kept.rows], softcap)
    row_max, log_s, mean_zc = row_stats(z, kept.rows, kept.offsets)
    valid = targets != ignore_index
    lse = torch.where(valid, row_max + log_s, 0.0)
    entropy = torch.where(valid, log_s - mean_zc, 0.0)
    z_y = torch.zeros(n, dtype=torch.float32, device=hidden.device)
    hit = kept.target_pos >= 0
    z_y[hit] = z[kept.target_pos[hit]]
    if missing_x is not None:
        rows = torch.nonzero(kept.missing).squeeze(1)
        z_y[rows] = final_logits(missing_x, scale[rows], softcap)
    return torch.where(valid, z_y - lse, 0.0), lse, entropy, x


def missing_target_logits(hidden, weight, bias, targets, kept: KeptSet) -> torch.Tensor | None:
    """Raw logits `[n_missing]` of the targets of rows flagged missing (None when there is none)."""
    if not bool(kept.missing.any()):
        return None
    rows = torch.nonzero(kept.missing).squeeze(1)
    local = torch.arange(rows.shape[0], device=rows.device)
    return _pair_logits(
        hidden[rows], weight, bias, targets[rows], local, torch.arange(rows.shape[0] + 1, device=rows.device)
    )


def pair_grads(x, z, scale_rows, saved, grads, kept: KeptSet, softcap):
    """∂loss/∂x per pair `[M]`: ∂z = g·(1[v = y] − p) − e·p·(log p + H), times the scale and the cap's slope;
    `saved` is the forward's (lse, entropy), `grads` the upstream (∂/∂logp = g, ∂/∂entropy = e), each or None."""
    (lse, entropy), (grad_logp, grad_entropy) = saved, grads
    rows = kept.rows
    log_p = (z - lse[rows]).clamp_(min=torch.finfo(torch.float32).min)  # p = 0: p·log p is 0, not NaN
    p = torch.exp(log_p)
    dz = torch.zeros_like(z)
    if grad_entropy is not None:
        dz -= grad_entropy.float()[rows] * p * (log_p + entropy[rows])
    if grad_logp is not None:
        g = grad_logp.float()
        dz -= g[rows] * p
        hit = kept.target_pos >= 0
        dz[kept.target_pos[hit]] += g[hit]
    return dz * scale_rows * cap_slope(x, softcap)


def cap_slope(x, softcap):
    """d softcap(x) / dx = 1 − tanh²(x / cap) (1 without a cap)."""
    if softcap is None:
        return 1.0
    return 1.0 - torch.tanh(x / softcap).square()


def replay_backward_torch(hidden, weight, bias, c, kept: KeptSet, extra, needs):
    """(d_hidden, d_weight, d_bias) from the pairs' ∂x `c` `[M]`; `extra` = (rows, ids, c) of missing targets.

    d_hidden[i] = Σ_j c_j W[ids_j] over row i's pairs; d_weight[v] = Σ_j c_j h[rows_j] over the pairs of token v,
    taken in (token id, row) order; d_bias[v] = Σ_j c_j likewise. Float32 sums, returned in the inputs' dtypes.
    """
    v = weight.shape[0]
    d_hidden = d_weight = d_bias = None
    if needs[0]:
        d_hidden = bag_sum(weight, kept.ids, kept.offsets, c)
        if extra is not None:
            rows, ids, c_y = extra
            d_hidden[rows] += weight.index_select(0, ids).float() * c_y.unsqueeze(1)
        d_hidden = d_hidden.to(hidden.dtype)
    if needs[1] or needs[2]:
        ids, rows = kept.ids, kept.rows
        order = kept.order
        if extra is not None:  # the missing targets' one-hot terms join the pairs, sorted in again
            ids, rows, c = torch.cat([ids, extra[1]]), torch.cat([rows, extra[0]]), torch.cat([c, extra[2]])
            order = torch.sort(ids, stable=True).indices
        offsets = token_offsets(ids[order], v)
        c_s = c[order]
        if needs[1]:
            d_weight = bag_sum(hidden, rows[order], offsets, c_s).to(weight.dtype)
        if needs[2]:
            d_bias = row_sums(c_s, offsets).to(bias.dtype)
    return d_hidden, d_weight, d_bias
