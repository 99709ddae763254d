"""The final logits of a block of rows exactly as the Triton forward builds them, written out (docs/math.md §8).

The θ search of the Triton path (sampled.py) runs on this `[C, V]` float32 tile, not on torch's logits: the same
`final_logit_tile` (the forward's config, so the same K steps, float32 accumulation, the same dot precision),
then the same row scale. The kept set {z ≥ θ} the kernels apply is then found on the very values they compare
with θ: the trainer agrees with itself (not with the sampler's own logits, which another GEMM computed).
"""

import torch
import triton
import triton.language as tl

from .. import configs
from .params import LogprobParams
from .tile import dot_flags, final_logit_tile, row_scale_of

__all__ = ["kernel_logits", "kernel_logits_kernel"]


@triton.heuristics(
    {"HAS_BIAS": lambda args: args["bias"] is not None, "HAS_ROW_SCALE": lambda args: args["row_scale"] is not None}
)
@triton.jit
def kernel_logits_kernel(hidden, weight, bias, row_scale, out, N, V, D, inv_temperature, softcap, stride_hn, stride_hd,
                         stride_wv, stride_wd, stride_b, stride_on, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                         HAS_ROW_SCALE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
                         BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr):  # fmt: skip
    i_n = tl.program_id(0).to(tl.int64)
    i_v = tl.program_id(1).to(tl.int64)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < N
    o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    m_v = o_v < V
    if HAS_ROW_SCALE:
        b_scale = row_scale_of(row_scale, o_n, m_n, inv_temperature)  # [BN]
    else:
        b_scale = inv_temperature
    b_z = final_logit_tile(
        hidden, weight, bias, softcap, b_scale, o_n, m_n, o_v, m_v, D, stride_hn, stride_hd, stride_wv, stride_wd,
        stride_b, HAS_BIAS, HAS_SOFTCAP, HAS_ROW_SCALE, BLOCK_N, BLOCK_V, BLOCK_D, DOT_PRECISION, DOT_UPCAST,
    )  # fmt: skip
    p_out = out + o_n[:, None] * stride_on + o_v[None, :]
    tl.store(p_out, b_z, mask=m_n[:, None] & m_v[None, :])


def kernel_logits(hidden, weight, bias, params: LogprobParams, row_scale=None, out=None) -> torch.Tensor:
    """`[C, D]`, `[V, D]`, `[V]`|None → the forward kernel's final logits `[C, V]` float32,
    softcap(h·W + b)·row_scale / τ (`row_scale` `[C]` float32 or None), into `out` when given."""
    c, d = hidden.shape
    v = weight.shape[0]
    name = configs.logprob_kernel("logprob_fwd", False, hidden.dtype != weight.dtype)
    cfg = configs.default_config(name, hidden.device)
    out = torch.empty(c, v, dtype=torch.float32, device=hidden.device) if out is None else out
    if out.shape != (c, v) or out.stride(1) != 1:
        raise ValueError(f"out must be a [C, V] = {(c, v)} float32 tile with unit column stride")
    grid = (triton.cdiv(c, cfg.kwargs["BLOCK_N"]), triton.cdiv(v, cfg.kwargs["BLOCK_V"]))
    kernel_logits_kernel[grid](
        hidden, weight, bias, row_scale, out, c, v, d, 1.0 / params.temperature, params.softcap or 1.0,
        hidden.stride(0), hidden.stride(1), weight.stride(0), weight.stride(1),
        bias.stride(0) if bias is not None else 0, out.stride(0),
        HAS_SOFTCAP=params.softcap is not None, **dot_flags(hidden, weight), **cfg.kwargs,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out
