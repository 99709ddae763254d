"""Replay backward: ∂x per kept pair, d_hidden per row, d_weight / d_bias per token id, no atomics (§9).

`replay_dh_kernel`: one program per (row, BLOCK_D slice) walks the row's set, recomputes z from the stored
raw logits x, forms ∂x = (g·(1[v = y] − p) − e·p·(log p + H))·scale·cap'(x), writes it (the slice-0 program)
and sums ∂x·W_v over the set into its slice of d_hidden.
`replay_dw_kernel`: the pairs sorted by token id (stably, once, by the caller) form one segment per id; one
program per (segment, BLOCK_D slice) sums ∂x·h_row over it in order and writes d_weight's row (and d_bias).
Every output element has one writer and a fixed summation order: two identical calls agree bit for bit.
"""

import torch
import triton
import triton.language as tl

from .. import configs
from .replay_torch import id_segments
from .tile import softcap_tile

__all__ = ["replay_backward_triton", "replay_dh_kernel", "replay_dw_kernel"]


@triton.heuristics(
    {
        "HAS_LOGP_GRAD": lambda args: args["grad_logp"] is not None,
        "HAS_ENTROPY_GRAD": lambda args: args["grad_entropy"] is not None,
    }
)
@triton.jit
def replay_dh_kernel(
    weight,
    ids,
    offsets,
    targets,
    scale,
    x,
    lse,
    entropy,
    grad_logp,
    grad_entropy,
    c_out,
    d_hidden,
    D,
    softcap,
    stride_wv,
    stride_wd,
    stride_dhn,
    HAS_LOGP_GRAD: tl.constexpr,
    HAS_ENTROPY_GRAD: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    i_n = tl.program_id(0).to(tl.int64)
    i_d = tl.program_id(1)
    k_lo = tl.load(offsets + i_n)
    k_hi = tl.load(offsets + i_n + 1)
    b_y = tl.load(targets + i_n)
    b_scale = tl.load(scale + i_n)
    b_lse = tl.load(lse + i_n)
    b_h = tl.load(entropy + i_n)
    b_g = 0.0
    b_e = 0.0
    if HAS_LOGP_GRAD:
        b_g = tl.load(grad_logp + i_n).to(tl.float32)
    if HAS_ENTROPY_GRAD:
        b_e = tl.load(grad_entropy + i_n).to(tl.float32)
    o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
    m_d = o_d < D
    b_acc = tl.zeros([BLOCK_K, BLOCK_D], dtype=tl.float32)  # reduced over the lanes once, at the end
    for k0 in range(k_lo, k_hi, BLOCK_K):
        o_k = k0 + tl.arange(0, BLOCK_K)
        m_k = o_k < k_hi
        b_id = tl.load(ids + o_k, mask=m_k, other=0).to(tl.int64)
        b_x = tl.load(x + o_k, mask=m_k, other=0.0)
        b_slope = 1.0
        if HAS_SOFTCAP:
            b_cap = softcap_tile(b_x, softcap)
            b_slope = 1.0 - (b_cap / softcap) * (b_cap / softcap)
            b_x = b_cap
        b_logp = tl.maximum(b_x * b_scale - b_lse, -3.4028234663852886e38)
        b_p = tl.exp(b_logp)
        b_dz = tl.where(b_id == b_y, b_g, 0.0) - b_g * b_p - b_e * b_p * (b_logp + b_h)
        b_c = tl.where(m_k, b_dz * b_scale * b_slope, 0.0)  # [BK]
        if i_d == 0:
            tl.store(c_out + o_k, b_c, mask=m_k)
        p_w = weight + b_id[:, None] * stride_wv + o_d[None, :] * stride_wd  # [BK, BD]
        b_w = tl.load(p_w, mask=m_k[:, None] & m_d[None, :], other=0.0).to(tl.float32)
        b_acc += b_c[:, None] * b_w
    tl.store(d_hidden + i_n * stride_dhn + o_d, tl.sum(b_acc, axis=0), mask=m_d)


@triton.heuristics({"HAS_BIAS_GRAD": lambda args: args["d_bias"] is not None})
@triton.jit
def replay_dw_kernel(
    hidden,
    seg_starts,
    seg_ids,
    order,
    rows,
    c,
    d_weight,
    d_bias,
    D,
    stride_hn,
    stride_hd,
    stride_dwv,
    HAS_BIAS_GRAD: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    i_u = tl.program_id(0).to(tl.int64)
    i_d = tl.program_id(1)
    j_lo = tl.load(seg_starts + i_u)
    j_hi = tl.load(seg_starts + i_u + 1)
    b_v = tl.load(seg_ids + i_u)
    o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
    m_d = o_d < D
    b_acc = tl.zeros([BLOCK_K, BLOCK_D], dtype=tl.float32)  # reduced over the lanes once, at the end
    b_accb = tl.zeros([BLOCK_K], dtype=tl.float32)
    for j0 in range(j_lo, j_hi, BLOCK_K):
        o_j = j0 + tl.arange(0, BLOCK_K)
        m_j = o_j < j_hi
        b_pair = tl.load(order + o_j, mask=m_j, other=0)
        b_c = tl.load(c + b_pair, mask=m_j, other=0.0)  # [BK]
        b_r = tl.load(rows + b_pair, mask=m_j, other=0).to(tl.int64)
        p_h = hidden + b_r[:, None] * stride_hn + o_d[None, :] * stride_hd  # [BK, BD]
        b_hid = tl.load(p_h, mask=m_j[:, None] & m_d[None, :], other=0.0).to(tl.float32)
        b_acc += b_c[:, None] * b_hid
        if HAS_BIAS_GRAD:
            b_accb += b_c
    tl.store(d_weight + b_v * stride_dwv + o_d, tl.sum(b_acc, axis=0), mask=m_d)
    if HAS_BIAS_GRAD:
        if i_d == 0:
            tl.store(d_bias + b_v, tl.sum(b_accb))


def replay_backward_triton(hidden, weight, bias, saved, grads, pairs, params, needs):
    """(d_hidden, d_weight, d_bias) of the replay forward. `saved` is the forward's (targets, scale, lse, entropy,
    x), `grads` the upstream (∂/∂logp, ∂/∂entropy), each or None; `pairs` = (kept, extra), extra = (rows, ids, ∂x)
    of targets outside their sets (added as pairs of their own) or None; `needs` = which of the three to form."""
    (targets, scale, lse, entropy, x), (grad_logp, grad_entropy), (kept, extra) = saved, grads, pairs
    n, d = hidden.shape
    v, dev = weight.shape[0], hidden.device
    m = kept.ids.shape[0]
    n_extra = 0 if extra is None else extra[0].shape[0]
    c = torch.empty(m + n_extra, dtype=torch.float32, device=dev)
    d_hidden = torch.zeros(n, d, dtype=torch.float32, device=dev)
    g = None if grad_logp is None else grad_logp.contiguous()
    e = None if grad_entropy is None else grad_entropy.contiguous()
    cfg = configs.replay_config("replay_dh", dev)
    replay_dh_kernel[(n, triton.cdiv(d, cfg["BLOCK_D"]))](
        weight, kept.ids, kept.offsets, targets, scale, x, lse, entropy, g, e,
        c, d_hidden, d, params.softcap or 1.0, weight.stride(0), weight.stride(1), d_hidden.stride(0),
        HAS_SOFTCAP=params.softcap is not None, **cfg,
    )  # fmt: skip
    ids, rows, order = kept.ids, kept.rows, kept.order
    if extra is not None:
        e_rows, e_ids, e_c = extra
        c[m:] = e_c
        d_hidden[e_rows] += weight.index_select(0, e_ids).float() * e_c.unsqueeze(1)
        ids, rows = torch.cat([ids, e_ids]), torch.cat([rows, e_rows])
        order = torch.sort(ids, stable=True).indices
    d_weight = d_bias = None
    if needs[1] or needs[2]:
        seg_ids, seg_starts = id_segments(ids[order])
        d_weight = torch.zeros(v, d, dtype=torch.float32, device=dev)
        d_bias = torch.zeros(v, dtype=torch.float32, device=dev) if needs[2] else None
        cfg = configs.replay_config("replay_dw", dev)
        if seg_ids.shape[0]:
            replay_dw_kernel[(seg_ids.shape[0], triton.cdiv(d, cfg["BLOCK_D"]))](
                hidden, seg_starts, seg_ids, order, rows, c, d_weight, d_bias, d,
                hidden.stride(0), hidden.stride(1), d_weight.stride(0), **cfg,
            )  # fmt: skip
        d_weight = d_weight.to(weight.dtype) if needs[1] else None
        d_bias = None if d_bias is None else d_bias.to(bias.dtype)
    return (d_hidden.to(hidden.dtype) if needs[0] else None), d_weight, d_bias
