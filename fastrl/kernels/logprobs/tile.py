"""The `[BLOCK_N, BLOCK_V]` logit tile both log-prob kernels build: a tensor-core K-loop over D."""

import os

import torch
import triton
import triton.language as tl

__all__ = ["dot_precision", "dot_upcast", "logit_tile"]


def dot_precision(dtype: torch.dtype):
    """tl.dot input precision: only fp32 inputs have a choice; follow torch's matmul setting."""
    if dtype != torch.float32:
        return None
    return "ieee" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def dot_upcast(dtype: torch.dtype) -> bool:
    """The Triton interpreter feeds bf16 tiles to tl.dot as raw uint16 bits; upcast them there only."""
    return dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def logit_tile(
    hidden,
    weight,
    o_n,
    m_n,
    o_v,
    m_v,
    D,
    stride_hn,
    stride_hd,
    stride_wv,
    stride_wd,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    o_d = tl.arange(0, BLOCK_D)
    p_h = hidden + o_n[:, None] * stride_hn + o_d[None, :] * stride_hd  # [BN, BD]
    p_w = weight + o_v.to(tl.int64)[None, :] * stride_wv + o_d[:, None] * stride_wd  # [BD, BV]
    b_acc = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(D, BLOCK_D)):
        m_d = o_d < D - i_k * BLOCK_D
        b_h = tl.load(p_h, mask=m_n[:, None] & m_d[None, :], other=0.0)
        b_w = tl.load(p_w, mask=m_d[:, None] & m_v[None, :], other=0.0)
        if DOT_UPCAST:
            b_h = b_h.to(tl.float32)
            b_w = b_w.to(tl.float32)
        b_acc = tl.dot(b_h, b_w, b_acc, input_precision=DOT_PRECISION)
        p_h += BLOCK_D * stride_hd
        p_w += BLOCK_D * stride_wd
    return b_acc
