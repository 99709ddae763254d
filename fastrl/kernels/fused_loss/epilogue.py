"""The Triton epilogue of the gradient-in-forward loss: fold a `[C, V]` logit tile, then form ∂z in it.

The GEMMs that make and consume the tile are cuBLAS (torch); these two kernels are memory-bound and read
the tile once each: `fold_stats_kernel` per row (online max / Σexp / Σexp·z → logp, entropy) and
`fold_dz_kernel` per `[1, BLOCK_V]` block (∂ℓ/∂z from the row's max, log Σ, entropy and upstream g, g_H).
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..configs import FUSED_DZ_BLOCK_V, FUSED_DZ_NUM_WARPS, FUSED_STATS_BLOCK_V, FUSED_STATS_NUM_WARPS

__all__ = ["FoldStats", "TritonFold", "fold_dz", "fold_dz_kernel", "fold_stats", "fold_stats_kernel"]


class FoldStats(NamedTuple):
    """What `fold_stats` reads off a tile, per row: lse = row_max + log_sum."""

    row_max: torch.Tensor  # [C] max of z / τ
    log_sum: torch.Tensor  # [C] log Σ exp(z / τ − max)
    logp: torch.Tensor  # [C]
    entropy: torch.Tensor | None  # [C], or None when not asked for


@triton.jit
def fold_stats_kernel(
    z,
    targets,
    tau,
    row_max,
    log_sum,
    logp,
    entropy,
    V,
    stride_zn,
    tau_scalar,
    PER_ROW_TAU: tl.constexpr,
    HAS_ENTROPY: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    # Every statistic is kept relative to the running max, never as lse or Σ p·z themselves: at
    # |z| ~ 100 those carry an absolute fp32 error of ~1e-5, which p = exp(z − lse) would turn into
    # a relative error of the gradient.
    i_n = tl.program_id(0).to(tl.int64)
    p_z = z + i_n * stride_zn
    if PER_ROW_TAU:
        b_tau = tl.load(tau + i_n)
    else:
        b_tau = tau_scalar
    b_m = tl.full([BLOCK_V], float("-inf"), tl.float32)
    b_s = tl.zeros([BLOCK_V], tl.float32)  # Σ exp(z − m)
    b_xs = tl.zeros([BLOCK_V], tl.float32)  # Σ exp(z − m)·(z − m)
    for i_v in range(0, tl.cdiv(V, BLOCK_V)):
        o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
        m_v = o_v < V
        b_z = tl.load(p_z + o_v, mask=m_v, other=0.0).to(tl.float32) / b_tau  # [BV]
        b_new = tl.where(m_v, tl.maximum(b_m, b_z), b_m)
        b_ref = tl.where(b_new == float("-inf"), 0.0, b_new)
        b_shift = tl.where(b_s > 0, b_m - b_ref, 0.0)
        b_scale = tl.exp(b_shift)
        b_e = tl.where(m_v, tl.exp(b_z - b_ref), 0.0)
        if HAS_ENTROPY:
            b_xs = (b_xs + b_s * b_shift) * b_scale + tl.where(m_v, b_e * (b_z - b_ref), 0.0)
        b_s = b_s * b_scale + b_e
        b_m = b_new
    b_row_m = tl.max(b_m, axis=0)
    b_shift = tl.where(b_s > 0, b_m - b_row_m, 0.0)
    b_w = tl.where(b_s > 0, tl.exp(b_shift), 0.0)
    b_total = tl.sum(b_s * b_w, axis=0)
    b_log_s = tl.log(b_total)
    b_t = tl.load(targets + i_n)
    b_tz = tl.load(p_z + tl.maximum(b_t, 0)).to(tl.float32) / b_tau
    tl.store(row_max + i_n, b_row_m)
    tl.store(log_sum + i_n, b_log_s)
    tl.store(logp + i_n, (b_tz - b_row_m) - b_log_s)
    if HAS_ENTROPY:
        b_xs_row = tl.sum(b_w * (b_xs + b_s * b_shift), axis=0)
        tl.store(entropy + i_n, b_log_s - b_xs_row / b_total)


@triton.jit
def fold_dz_kernel(
    z,
    dz,
    targets,
    tau,
    row_max,
    log_sum,
    entropy,
    g,
    g_entropy,
    V,
    stride_zn,
    stride_dzn,
    tau_scalar,
    PER_ROW_TAU: tl.constexpr,
    HAS_ENTROPY_GRAD: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    i_n = tl.program_id(0).to(tl.int64)
    o_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    m_v = o_v < V
    if PER_ROW_TAU:
        b_tau = tl.load(tau + i_n)
    else:
        b_tau = tau_scalar
    b_z = tl.load(z + i_n * stride_zn + o_v, mask=m_v, other=0.0).to(tl.float32) / b_tau
    b_logp = (b_z - tl.load(row_max + i_n)) - tl.load(log_sum + i_n)  # [BV]
    b_p = tl.exp(b_logp)  # [BV]
    b_g = tl.load(g + i_n)
    b_dz = tl.where(o_v == tl.load(targets + i_n), b_g, 0.0) - b_g * b_p
    if HAS_ENTROPY_GRAD:
        b_dz -= tl.load(g_entropy + i_n) * b_p * (b_logp + tl.load(entropy + i_n))
    tl.store(dz + i_n * stride_dzn + o_v, (b_dz / b_tau).to(dz.dtype.element_ty), mask=m_v)


def _tau_args(tau, placeholder):
    # (pointer, scalar, PER_ROW_TAU): a float temperature travels as a runtime scalar, never a constexpr
    if isinstance(tau, torch.Tensor):
        return tau.float().contiguous(), 1.0, True
    return placeholder, float(tau), False


def fold_stats(z, targets, tau, entropy: bool):
    """`[C, V]` float32 logits (unit column stride), `[C]` targets, τ (float or `[C]`) → `FoldStats`."""
    c, v = z.shape
    if z.stride(1) != 1:
        raise ValueError(f"the logit tile must have unit column stride, got strides {z.stride()}")
    row_max = torch.empty(c, dtype=torch.float32, device=z.device)
    log_sum, logp = torch.empty_like(row_max), torch.empty_like(row_max)
    ent = torch.empty_like(row_max) if entropy else row_max
    tau_ptr, tau_scalar, per_row = _tau_args(tau, row_max)
    fold_stats_kernel[(c,)](
        z,
        targets.contiguous(),
        tau_ptr,
        row_max,
        log_sum,
        logp,
        ent,
        v,
        z.stride(0),
        tau_scalar,
        PER_ROW_TAU=per_row,
        HAS_ENTROPY=entropy,
        BLOCK_V=FUSED_STATS_BLOCK_V,
        num_warps=FUSED_STATS_NUM_WARPS,
    )
    return FoldStats(row_max, log_sum, logp, ent if entropy else None)


def fold_dz(z, out, targets, tau, stats: FoldStats, g, g_entropy):
    """∂ℓ/∂(h·Wᵀ) of the tile into `out` (`[C, V]`, any float dtype; may be z itself), from the tile's `stats`
    (its entropy read only with g_entropy)."""
    c, v = z.shape
    if out.shape != z.shape or out.stride(1) != 1:
        raise ValueError(f"out must be a [C, V] = {tuple(z.shape)} tile with unit column stride")
    row_max = stats.row_max
    tau_ptr, tau_scalar, per_row = _tau_args(tau, row_max)
    has_eg = g_entropy is not None
    grid = (c, triton.cdiv(v, FUSED_DZ_BLOCK_V))
    fold_dz_kernel[grid](
        z,
        out,
        targets.contiguous(),
        tau_ptr,
        row_max,
        stats.log_sum,
        stats.entropy if has_eg else row_max,
        g.float().contiguous(),
        g_entropy.float().contiguous() if has_eg else row_max,
        v,
        z.stride(0),
        out.stride(0),
        tau_scalar,
        PER_ROW_TAU=per_row,
        HAS_ENTROPY_GRAD=has_eg,
        BLOCK_V=FUSED_DZ_BLOCK_V,
        num_warps=FUSED_DZ_NUM_WARPS,
    )
    return out


class TritonFold:
    """The fold and ∂z of one tile (api.py's `TorchFold`) as the two kernels above, each reading the tile once."""

    def __init__(self, z, targets, tau, entropy: bool):
        self.z, self.targets, self.tau = z, targets, tau
        self.stats = fold_stats(z, targets, tau, entropy)
        self.logp, self.entropy = self.stats.logp, self.stats.entropy

    def dz(self, g, g_entropy, out):
        """∂ℓ/∂(h·Wᵀ) into `out` (the tile itself, or a buffer in the GEMMs' dtype)."""
        return fold_dz(self.z, out, self.targets, self.tau, self.stats, g, g_entropy)
