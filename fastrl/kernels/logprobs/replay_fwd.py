"""Replay forward: one program per row walks its kept set in BLOCK_K pieces (docs/math.md §9).

Each piece gathers its BLOCK_K weight rows in BLOCK_D slices and forms the raw logits x = h·W_v + b_v as
row-wise dots (a gemv per row: no tensor cores, the kernel reads M·D weight elements and that is its cost),
stores them for the backward, and folds z = softcap(x)·scale into an online max / Σ exp / Σ exp·(z − max).
A row's statistics depend only on its own set and hidden state, in a fixed order: the outputs are
deterministic and batch-invariant (no split of a row over programs, no autotuning).
"""

import torch
import triton
import triton.language as tl

from .. import configs
from .kept_set import KeptSet
from .tile import softcap_tile

__all__ = ["replay_forward_triton", "replay_fwd_kernel"]

_M_INIT = tl.constexpr(-1e30)


@triton.heuristics({"HAS_BIAS": lambda args: args["bias"] is not None})
@triton.jit
def replay_fwd_kernel(
    hidden,
    weight,
    bias,
    ids,
    offsets,
    targets,
    scale,
    x_out,
    logp_out,
    lse_out,
    entropy_out,
    D,
    softcap,
    stride_hn,
    stride_hd,
    stride_wv,
    stride_wd,
    stride_b,
    HAS_BIAS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    i_n = tl.program_id(0).to(tl.int64)
    k_lo = tl.load(offsets + i_n)
    k_hi = tl.load(offsets + i_n + 1)
    b_y = tl.load(targets + i_n)
    b_scale = tl.load(scale + i_n)
    # lane-wise online statistics (lane j folds positions j, j + BLOCK_K, …), merged once at the end: one
    # reduction per piece of the set (the dot over D), and a fixed order
    b_m = tl.full([BLOCK_K], _M_INIT, dtype=tl.float32)
    b_s = tl.zeros([BLOCK_K], dtype=tl.float32)
    b_t = tl.zeros([BLOCK_K], dtype=tl.float32)
    b_zy = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        o_k = k0 + tl.arange(0, BLOCK_K)
        m_k = o_k < k_hi
        b_id = tl.load(ids + o_k, mask=m_k, other=0).to(tl.int64)
        b_hw = tl.zeros([BLOCK_K, BLOCK_D], dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            o_d = d0 + tl.arange(0, BLOCK_D)
            m_d = o_d < D
            b_h = tl.load(hidden + i_n * stride_hn + o_d * stride_hd, mask=m_d, other=0.0).to(tl.float32)  # [BD]
            p_w = weight + b_id[:, None] * stride_wv + o_d[None, :] * stride_wd  # [BK, BD]
            b_w = tl.load(p_w, mask=m_k[:, None] & m_d[None, :], other=0.0).to(tl.float32)
            b_hw += b_w * b_h[None, :]
        b_x = tl.sum(b_hw, axis=1)  # [BK]
        if HAS_BIAS:
            b_x += tl.load(bias + b_id * stride_b, mask=m_k, other=0.0).to(tl.float32)
        tl.store(x_out + o_k, b_x, mask=m_k)
        b_z = b_x
        if HAS_SOFTCAP:
            b_z = softcap_tile(b_z, softcap)
        b_z = tl.where(m_k, b_z * b_scale, _M_INIT)  # [BK]
        b_zy += tl.where(m_k & (b_id == b_y), b_z, 0.0)  # at most one pair holds the target
        b_mn = tl.maximum(b_m, b_z)
        b_alpha = tl.exp(b_m - b_mn)
        b_zc = b_z - b_mn
        b_p = tl.where(m_k, tl.exp(b_zc), 0.0)
        b_t = b_alpha * (b_t + (b_m - b_mn) * b_s) + tl.where(b_p > 0.0, b_p * b_zc, 0.0)
        b_s = b_alpha * b_s + b_p
        b_m = b_mn
    b_max = tl.max(b_m)
    b_beta = tl.where(b_s > 0.0, tl.exp(b_m - b_max), 0.0)  # [BK]: an unused lane (s = 0) adds nothing
    b_t = tl.sum(b_beta * (b_t + (b_m - b_max) * b_s))
    b_s = tl.sum(b_beta * b_s)
    b_m = b_max
    b_zy = tl.sum(b_zy)
    b_live = k_hi > k_lo  # an ignored row has an empty set
    b_log_s = tl.log(tl.where(b_live, b_s, 1.0))
    b_lse = tl.where(b_live, b_m + b_log_s, 0.0)
    tl.store(lse_out + i_n, b_lse)
    tl.store(logp_out + i_n, tl.where(b_live, b_zy - b_lse, 0.0))
    tl.store(entropy_out + i_n, tl.where(b_live, b_log_s - b_t / tl.where(b_live, b_s, 1.0), 0.0))


def replay_forward_triton(hidden, weight, bias, targets, scale, kept: KeptSet, params):
    """(logp `[N]`, lse `[N]`, entropy `[N]`, x `[M]`), float32; a row whose target is outside its set gets
    logp = −lse here (the caller adds its target logit)."""
    n, d = hidden.shape
    m = kept.ids.shape[0]
    dev = hidden.device
    x = configs.alloc((m,), torch.float32, dev)
    logp, lse, entropy = (configs.alloc((n,), torch.float32, dev) for _ in range(3))
    if n == 0:
        return logp, lse, entropy, x
    cfg = configs.replay_config("replay_fwd", dev)
    replay_fwd_kernel[(n,)](
        hidden, weight, bias, kept.ids, kept.offsets, targets, scale, x, logp, lse, entropy,
        d, params.softcap or 1.0, hidden.stride(0), hidden.stride(1), weight.stride(0), weight.stride(1),
        bias.stride(0) if bias is not None else 0,
        HAS_SOFTCAP=params.softcap is not None, **cfg,
    )  # fmt: skip
    return logp, lse, entropy, x
