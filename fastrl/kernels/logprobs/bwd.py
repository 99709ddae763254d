"""Backward: recompute logit tiles, form ∂L/∂z (docs/math.md §1), then the two gradient GEMMs.

Design trade-off. The gradient GEMMs have D = 4096 wide outputs, so a fused tile kernel cannot keep
its d_hidden `[BLOCK_N, D]` / d_weight `[BLOCK_V, D]` accumulators on chip: either it adds them
atomically into fp32 buffers once per tile, (1/BLOCK_N + 1/BLOCK_V)·N·V·D atomics (~0.6 TB of
traffic at N = 16k, V = 152k), or it recomputes the logits once per output, 2× the FLOPs. Instead
the vocab is walked in chunks: `logprob_dz_kernel` recomputes each `[BLOCK_N, BLOCK_V]` logit tile
(tensor-core K-loop, as in the forward) and writes ∂L/∂z / τ for one `[N, V_chunk]` slab in the
input dtype, bounded by `configs.BWD_SLAB_BYTES` (never `[N, V]`); cuBLAS then does
d_weight[chunk] = slabᵀ h (complete, fp32-accumulated inside the GEMM) and
d_hidden += slab W[chunk] (fp32 across chunks). That is the 6·N·D·V FLOP floor, with 4·N·D·V of it
at cuBLAS speed, and O(N·D) fp32 extra memory besides the slab. With a kept-set threshold, soft-cap or
per-row scale (docs/math.md §1.1) the slab holds ∂L/∂(h·W + b) with the kept set fixed and the chain
factors applied; with an fp32 head it is float32, as are both GEMMs. Asked for batch invariance (docs/math.md
§1.2), the slab width is that of a fixed token count and d_hidden is summed in `configs.INVARIANT_GEMM_ROWS`-row
GEMMs of one shape.
"""

import torch
import triton
import triton.language as tl

from .. import configs
from .params import LogprobParams
from .tile import OPTIONAL_INPUTS, capped_logit_tile, dot_flags, row_scale_of

__all__ = ["logprob_backward", "logprob_dz_kernel"]


@triton.heuristics({**OPTIONAL_INPUTS, "HAS_ENTROPY_GRAD": lambda args: args["grad_entropy"] is not None})
@triton.jit
def logprob_dz_kernel(
    hidden,
    weight,
    bias,
    targets,
    lse,
    entropy,
    grad_logp,
    grad_entropy,
    dz,
    theta,
    row_scale,
    N,
    D,
    v_lo,
    n_cols,
    inv_temperature,
    softcap,
    ignore_index,
    n_bucket,
    stride_hn,
    stride_hd,
    stride_wv,
    stride_wd,
    stride_b,
    stride_y,
    stride_dzn,
    HAS_BIAS: tl.constexpr,
    HAS_ENTROPY_GRAD: tl.constexpr,
    HAS_THRESHOLD: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GROUP_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    # GROUP_N token blocks sweep the chunk's vocab tiles together, so their hidden rows and the
    # current weight tiles are both L2-resident (the grouped ordering of the Triton matmul tutorial)
    i_p = tl.program_id(0)
    n_blocks = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_N * tl.cdiv(n_cols, BLOCK_V)
    first = (i_p // per_group) * GROUP_N
    group_size = tl.minimum(n_blocks - first, GROUP_N)
    i_n = (first + (i_p % per_group) % group_size).to(tl.int64)
    i_c = ((i_p % per_group) // group_size).to(tl.int64)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < N
    o_c = (i_c * BLOCK_V).to(tl.int32) + tl.arange(0, BLOCK_V)
    m_c = o_c < n_cols
    o_v = v_lo + o_c.to(tl.int64)

    b_z = capped_logit_tile(
        hidden, weight, bias, softcap, o_n, m_n, o_v, m_c, D, stride_hn, stride_hd, stride_wv, stride_wd,
        stride_b, HAS_BIAS, HAS_SOFTCAP, BLOCK_N, BLOCK_V, BLOCK_D, DOT_PRECISION, DOT_UPCAST,
    )  # fmt: skip
    if HAS_ROW_SCALE:
        b_scale = row_scale_of(row_scale, o_n, m_n, inv_temperature)[:, None]  # [BN, 1]
    else:
        b_scale = inv_temperature
    b_z = b_z * b_scale  # [BN, BV]

    b_y = tl.load(targets + o_n * stride_y, mask=m_n, other=ignore_index).to(tl.int32)
    m_r = m_n & (b_y != ignore_index)
    b_lse = tl.load(lse + o_n, mask=m_n, other=0.0)
    b_g = tl.load(grad_logp + o_n, mask=m_r, other=0.0)
    b_lp = b_z - b_lse[:, None]  # [BN, BV] log p
    if HAS_THRESHOLD:
        # the kept set is fixed: a dropped token has p = 0 (its one-hot term, for a dropped target, stays)
        b_theta = tl.load(theta + o_n, mask=m_n, other=float("-inf"))
        b_lp = tl.where(b_z >= b_theta[:, None], b_lp, float("-inf"))
    b_p = tl.exp(b_lp)  # [BN, BV]
    if HAS_ENTROPY_GRAD:
        # z − Σ_u p z = log p + H; p = 0 (a −inf bias, a dropped token): no entropy gradient, not 0·(−inf)
        b_h = tl.load(entropy + o_n, mask=m_n, other=0.0)
        b_e = tl.load(grad_entropy + o_n, mask=m_r, other=0.0)
        b_p = tl.where(b_p > 0.0, b_p * (b_g[:, None] + b_e[:, None] * (b_lp + b_h[:, None])), 0.0)
    else:
        b_p = b_p * b_g[:, None]
    b_yc = (b_y - v_lo).to(tl.int32)  # the target's column in this chunk (a vocab index: int32 even if v_lo is not)
    b_dz = tl.where(o_c[None, :] == b_yc[:, None], b_g[:, None], 0.0) - b_p
    if HAS_SOFTCAP:
        # ∂cap/∂x = 1 − tanh², tanh = z / (cap·scale): recomputed here, not a second live tile
        b_tanh = b_z * (1.0 / (b_scale * softcap))
        b_dz = b_dz * b_scale * (1.0 - b_tanh * b_tanh)
    else:
        b_dz = b_dz * b_scale
    b_dz = tl.where(m_r[:, None] & m_c[None, :], b_dz, 0.0)

    p_dz = dz + o_n[:, None] * stride_dzn + o_c[None, :]
    tl.store(p_dz, b_dz.to(dz.dtype.element_ty), mask=m_n[:, None] & m_c[None, :])


_OUT_DTYPE_MM = {}


def _mm_f32(acc: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """acc + a @ b in float32, with half-precision a, b fed to the GEMM as they are when torch can."""
    if a.dtype == torch.float32:
        return a @ b if acc is None else acc.addmm_(a, b)
    dev = a.device.type
    if _OUT_DTYPE_MM.get(dev, True):
        try:
            if acc is None:
                return torch.mm(a, b, out_dtype=torch.float32)
            return torch.addmm(acc, a, b, out_dtype=torch.float32)
        except (NotImplementedError, RuntimeError, TypeError):
            _OUT_DTYPE_MM[dev] = False
    # Older torch or CPU: each chunk's product is rounded to the input dtype once, then summed in fp32.
    prod = (a @ b).float()
    return prod if acc is None else acc.add_(prod)


# The token count whose slab width a batch-invariant backward takes at every N (its slab passes BWD_SLAB_BYTES
# beyond it).
_INVARIANT_TOKENS = 32768


def _blocked_mm_f32(acc: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, rows: int) -> torch.Tensor:
    """acc + a @ b in float32 (acc None: zeros), one GEMM per `rows` rows of a (its row count a multiple of
    rows): every product has one shape, so a row's sum never follows the number of rows (batch invariance)."""
    if acc is None:
        acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32, device=a.device)
    for i in range(0, a.shape[0], rows):
        acc[i : i + rows] = _mm_f32(acc[i : i + rows], a[i : i + rows], b)
    return acc


def _slab_cols(n_tokens: int, vocab: int, elem_bytes: int) -> int:
    """Vocab columns per backward chunk: under BWD_SLAB_BYTES (or one BLOCK_V unit), a multiple of every BLOCK_V."""
    unit = max(c.kwargs["BLOCK_V"] for arch in (80, 90) for c in configs.shipped_configs("logprob_dz", arch))
    cols = max(unit, configs.BWD_SLAB_BYTES // max(1, n_tokens * elem_bytes) // unit * unit)
    n_chunks = triton.cdiv(vocab, cols)
    return triton.cdiv(triton.cdiv(vocab, n_chunks), unit) * unit  # equal chunks, not a thin last one


def logprob_backward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None,
    saved: tuple,
    grads: tuple,
    params: LogprobParams,
    needs: tuple[bool, bool, bool],
):
    """(d_hidden, d_weight, d_bias), each None unless `needs` (hidden, weight, bias) asks for it.

    `saved` is the forward's (lse, entropy, theta, row_scale) and `grads` the upstream (∂/∂logp, ∂/∂entropy): lse,
    entropy and the gradients `[N]` float32 (those of the kept set when `theta` is given, which the gradient treats
    as fixed); `theta`, `row_scale` as in `logprob_partials`, or None. The slab is in the weight's dtype: float32 for
    a half-precision hidden with an fp32 head, whose d_hidden comes back in hidden's dtype and d_weight in float32.
    """
    (lse, entropy, theta, row_scale), (grad_logp, grad_entropy) = saved, grads
    n, d = hidden.shape
    v = weight.shape[0]
    dev = hidden.device
    invariant = params.batch_invariant
    # batch invariance: the chunk width (the order of the d_hidden sum) of a fixed token count, not N's
    chunk_cols = min(_slab_cols(_INVARIANT_TOKENS if invariant else n, v, weight.element_size()), v)
    grad_logp = torch.zeros(n, dtype=torch.float32, device=dev) if grad_logp is None else grad_logp.float()
    if grad_entropy is not None:
        if entropy is None:
            raise ValueError("an entropy gradient needs the forward's entropy (return_entropy=True)")
        grad_entropy = grad_entropy.float().contiguous()
    grad_logp = grad_logp.contiguous()

    sampled = theta is not None or row_scale is not None or params.softcap is not None
    name = configs.logprob_kernel("logprob_dz", sampled, hidden.dtype != weight.dtype)
    fn, kwargs = configs.kernel_and_kwargs(name, logprob_dz_kernel, dev, tune=not invariant)
    rows = configs.INVARIANT_GEMM_ROWS
    n_pad = triton.cdiv(n, rows) * rows if invariant else n
    dz = configs.alloc((n_pad, chunk_cols), weight.dtype, dev)
    dz[n:].zero_()  # the padding rows of the invariant d_hidden GEMMs (the kernel writes rows < N)
    d_weight = torch.empty(weight.shape, dtype=weight.dtype, device=dev) if needs[1] else None
    d_bias = torch.empty(v, dtype=torch.float32, device=dev) if needs[2] else None
    d_hidden = None
    h_gemm = hidden
    if d_weight is not None:
        # An ignored row's dz is 0, but it may be padding whose hidden state is inf/NaN, and 0·NaN in the
        # d_weight GEMM would poison every row of d_weight: zero those rows (an [N, D] copy, no sync).
        h_gemm = torch.where((targets != params.ignore_index).unsqueeze(-1), hidden, 0.0).to(weight.dtype)
    for v_lo in range(0, v, chunk_cols):
        cols = min(chunk_cols, v - v_lo)

        def grid(meta):
            return (triton.cdiv(n, meta["BLOCK_N"]) * triton.cdiv(cols, meta["BLOCK_V"]),)

        fn[grid](
            hidden, weight, bias, targets, lse, entropy, grad_logp, grad_entropy, dz, theta, row_scale,
            n, d, v_lo, cols, 1.0 / params.temperature, params.softcap or 1.0, params.ignore_index,
            configs.token_bucket(n), hidden.stride(0), hidden.stride(1), weight.stride(0), weight.stride(1),
            bias.stride(0) if bias is not None else 0, targets.stride(0), dz.stride(0),
            HAS_SOFTCAP=params.softcap is not None, **dot_flags(hidden, weight), **kwargs,
        )  # fmt: skip
        slab = dz[:n, :cols]
        w_chunk = weight[v_lo : v_lo + cols]
        if d_weight is not None:
            torch.mm(slab.t(), h_gemm, out=d_weight[v_lo : v_lo + cols])
        if d_bias is not None:
            d_bias[v_lo : v_lo + cols] = slab.sum(0, dtype=torch.float32)
        if needs[0] and invariant:
            d_hidden = _blocked_mm_f32(d_hidden, dz[:, :cols], w_chunk, rows)
        elif needs[0]:
            if cols == v:
                d_hidden = slab @ w_chunk
            else:
                d_hidden = _mm_f32(d_hidden, slab, w_chunk)
    if d_hidden is not None:
        d_hidden = d_hidden[:n].to(hidden.dtype)
    if d_bias is not None:
        d_bias = d_bias.to(bias.dtype)
    return d_hidden, d_weight, d_bias
