"""The `[BLOCK_N, BLOCK_V]` logit tile both log-prob kernels build: a tensor-core K-loop over D.

Also the pieces of the final logit both kernels apply to it: the bias and the soft-cap `cap·tanh(x / cap)`
(`capped_logit_tile`), the per-row scale (1/τ, or a per-row factor times it), and the constexpr flags of the
optional inputs both kernels take.
"""

import os

import torch
import triton
import triton.language as tl

__all__ = [
    "OPTIONAL_INPUTS",
    "capped_logit_tile",
    "dot_flags",
    "dot_precision",
    "dot_upcast",
    "final_logit_tile",
    "logit_tile",
    "row_scale_of",
    "softcap_tile",
]

# The optional inputs of both kernels become constexpr flags: a None pointer compiles its branch away.
OPTIONAL_INPUTS = {
    "HAS_BIAS": lambda args: args["bias"] is not None,
    "HAS_THRESHOLD": lambda args: args["theta"] is not None,
    "HAS_ROW_SCALE": lambda args: args["row_scale"] is not None,
}


def dot_precision(dtype: torch.dtype):
    """tl.dot input precision: only fp32 inputs have a choice; follow torch's matmul setting."""
    if dtype != torch.float32:
        return None
    return "ieee" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def dot_upcast(dtype: torch.dtype) -> bool:
    """The Triton interpreter feeds bf16 tiles to tl.dot as raw uint16 bits; upcast them there only."""
    return dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET", "0") == "1"


def dot_flags(hidden: torch.Tensor, weight: torch.Tensor) -> dict:
    """DOT_PRECISION / DOT_UPCAST of a launch. A half-precision hidden with a float32 head (an fp32 LM head)
    upcasts the hidden tile in the kernel and takes an IEEE float32 dot: the logits of an fp32 head, no TF32."""
    if hidden.dtype != weight.dtype:
        return {"DOT_PRECISION": "ieee", "DOT_UPCAST": True}
    return {"DOT_PRECISION": dot_precision(hidden.dtype), "DOT_UPCAST": dot_upcast(hidden.dtype)}


@triton.jit
def softcap_tile(b_x, cap):
    # cap·tanh(x / cap). The interpreter has no libdevice tanh, so: tanh|u| = (1 − e) / (1 + e) with
    # e = exp(−2|u|), and a Taylor series below |u| = 0.25, where 1 − e would cancel (truncation < 1e-8
    # relative there); a few float32 ulps of tanh either way.
    b_u = b_x * (1.0 / cap)
    b_a = tl.abs(b_u)
    b_e = tl.exp(-2.0 * b_a)
    b_u2 = b_u * b_u
    b_poly = 1.0 + b_u2 * (-1.0 / 3.0 + b_u2 * (2.0 / 15.0 + b_u2 * (-17.0 / 315.0 + b_u2 * (62.0 / 2835.0))))
    b_t = tl.where(b_a < 0.25, b_a * b_poly, (1.0 - b_e) / (1.0 + b_e))
    return tl.where(b_u < 0.0, -cap * b_t, cap * b_t)


@triton.jit
def row_scale_of(row_scale, o_n, m_n, inv_temperature):
    # [BN]: the factor of each row's capped logits, row_scale[n] / τ
    return tl.load(row_scale + o_n, mask=m_n, other=1.0).to(tl.float32) * inv_temperature


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


@triton.jit
def capped_logit_tile(hidden, weight, bias, softcap, o_n, m_n, o_v, m_v, D, stride_hn, stride_hd, stride_wv, stride_wd,
                      stride_b, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
                      DOT_UPCAST: tl.constexpr):  # fmt: skip
    # [BN, BV]: softcap(h·W + b), the final logits before the row scale
    b_z = logit_tile(
        hidden, weight, o_n, m_n, o_v, m_v, D, stride_hn, stride_hd, stride_wv, stride_wd,
        BLOCK_N, BLOCK_V, BLOCK_D, DOT_PRECISION, DOT_UPCAST,
    )  # fmt: skip
    if HAS_BIAS:
        b_b = tl.load(bias + o_v.to(tl.int64) * stride_b, mask=m_v, other=0.0).to(tl.float32)
        b_z += b_b[None, :]
    if HAS_SOFTCAP:
        b_z = softcap_tile(b_z, softcap)
    return b_z


@triton.jit
def final_logit_tile(hidden, weight, bias, softcap, b_scale, o_n, m_n, o_v, m_v, D, stride_hn, stride_hd, stride_wv,
                     stride_wd, stride_b, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                     HAS_ROW_SCALE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
                     BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr):  # fmt: skip
    # [BN, BV]: the final logits softcap(h·W + b)·scale, b_scale [BN] (HAS_ROW_SCALE) or one scalar
    b_z = capped_logit_tile(
        hidden, weight, bias, softcap, o_n, m_n, o_v, m_v, D, stride_hn, stride_hd, stride_wv, stride_wd,
        stride_b, HAS_BIAS, HAS_SOFTCAP, BLOCK_N, BLOCK_V, BLOCK_D, DOT_PRECISION, DOT_UPCAST,
    )  # fmt: skip
    if HAS_ROW_SCALE:
        b_z = b_z * b_scale[:, None]
    else:
        b_z = b_z * b_scale
    return b_z
