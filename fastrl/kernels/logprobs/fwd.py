"""Forward: per-token logsumexp, target logit and entropy statistics, straight from hidden and weight.

Programs = token blocks × vocab splits. Each builds `[BLOCK_N, BLOCK_V]` logit tiles with a
tensor-core K-loop over D and folds them into an online logsumexp over its slice of the vocab,
writing three partials per (split, token): running max m, Σ exp(z − m) and Σ exp(z − m)(z − m).
The first split's programs also write the target logit, a row-wise dot with the gathered weight row.
`merge_partials` combines the splits with O(N · splits) torch ops. There are at least
`configs.FWD_MIN_SPLITS` splits (L2 reuse, see the kernel) and more when N is too small to fill the
GPU (a fixed `configs.FWD_INVARIANT_SPLITS`, summed in order, when the call asks for batch invariance).
Entropy is kept relative to the running max, H = log S − T / S, so large logits do not make it the
difference of two large numbers. Nothing of size N·V is ever stored.
"""

import torch
import triton
import triton.language as tl

from .. import configs
from .params import LogprobParams
from .tile import OPTIONAL_INPUTS, dot_flags, final_logit_tile, row_scale_of, softcap_tile

__all__ = ["logprob_forward", "logprob_fwd_kernel", "logprob_partials", "merge_partials"]

# Start of the running max and the logit of masked columns: finite, so (m_old − m_new) · 0 and
# exp(z − m) · (z − m) stay 0 where -inf would give NaN.
_M_INIT = tl.constexpr(-1e30)


@triton.jit
def _target_logit(
    hidden,
    weight,
    bias,
    b_y,
    o_n,
    m_n,
    V,
    D,
    b_scale,
    softcap,
    stride_hn,
    stride_hd,
    stride_wv,
    stride_wd,
    stride_b,
    HAS_BIAS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # z[n, y[n]] as a row-wise dot with the gathered weight rows: O(N·D), outside the vocab loop.
    m_y = m_n & (b_y >= 0) & (b_y < V)
    o_y = tl.where(m_y, b_y, 0).to(tl.int64)
    o_d = tl.arange(0, BLOCK_D)
    p_h = hidden + o_n[:, None] * stride_hn + o_d[None, :] * stride_hd  # [BN, BD]
    p_w = weight + o_y[:, None] * stride_wv + o_d[None, :] * stride_wd  # [BN, BD]
    b_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(D, BLOCK_D)):
        m_hw = m_y[:, None] & (o_d < D - i_k * BLOCK_D)[None, :]
        b_h = tl.load(p_h, mask=m_hw, other=0.0).to(tl.float32)
        b_w = tl.load(p_w, mask=m_hw, other=0.0).to(tl.float32)
        b_acc += tl.sum(b_h * b_w, axis=1)
        p_h += BLOCK_D * stride_hd
        p_w += BLOCK_D * stride_wd
    if HAS_BIAS:
        b_acc += tl.load(bias + o_y * stride_b, mask=m_y, other=0.0).to(tl.float32)
    if HAS_SOFTCAP:
        b_acc = softcap_tile(b_acc, softcap)
    return b_acc * b_scale


@triton.heuristics({**OPTIONAL_INPUTS, "HAS_ENTROPY": lambda args: args["part_t"] is not None})
@triton.jit
def logprob_fwd_kernel(
    hidden,
    weight,
    bias,
    targets,
    part_m,
    part_s,
    part_t,
    target_z,
    theta,
    row_scale,
    N,
    V,
    D,
    n_splits,
    inv_temperature,
    softcap,
    n_bucket,
    stride_hn,
    stride_hd,
    stride_wv,
    stride_wd,
    stride_b,
    stride_y,
    HAS_BIAS: tl.constexpr,
    HAS_ENTROPY: tl.constexpr,
    HAS_THRESHOLD: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    # splits vary fastest: a resident wave is ~SMs/splits token blocks whose hidden rows stay in L2
    # while each split's programs walk one vocab range in step and share its weight tiles
    i_s = tl.program_id(0) % n_splits
    i_n = (tl.program_id(0) // n_splits).to(tl.int64)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < N
    b_y = tl.load(targets + o_n * stride_y, mask=m_n, other=-1)
    if HAS_ROW_SCALE:
        b_scale = row_scale_of(row_scale, o_n, m_n, inv_temperature)  # [BN]
    else:
        b_scale = inv_temperature
    if HAS_THRESHOLD:
        b_theta = tl.load(theta + o_n, mask=m_n, other=float("-inf"))

    tiles_per_split = tl.cdiv(tl.cdiv(V, BLOCK_V), n_splits)
    t_lo = i_s * tiles_per_split
    t_hi = tl.minimum(t_lo + tiles_per_split, tl.cdiv(V, BLOCK_V))

    b_m = tl.full([BLOCK_N], _M_INIT, dtype=tl.float32)
    b_s = tl.zeros([BLOCK_N], dtype=tl.float32)
    b_t = tl.zeros([BLOCK_N], dtype=tl.float32)
    for i_t in range(t_lo, t_hi):
        o_v = i_t * BLOCK_V + tl.arange(0, BLOCK_V)
        m_v = o_v < V
        b_z = final_logit_tile(
            hidden, weight, bias, softcap, b_scale, o_n, m_n, o_v, m_v, D, stride_hn, stride_hd, stride_wv,
            stride_wd, stride_b, HAS_BIAS, HAS_SOFTCAP, HAS_ROW_SCALE, BLOCK_N, BLOCK_V, BLOCK_D, DOT_PRECISION,
            DOT_UPCAST,
        )  # fmt: skip
        if HAS_THRESHOLD:
            # a dropped token is a masked column. Tiles before a row's first kept token leave max -1e30 and
            # count exp(0) = 1s; the first kept logit rescales them by exp(-1e30 − m) = 0 (the merge does the
            # same to a split that holds no kept token), so no extra select is needed
            m_keep = m_v[None, :] & (b_z >= b_theta[:, None])  # [BN, BV]
        else:
            m_keep = m_v[None, :]
        # masked columns get a finite -1e30, not -inf: exp gives 0 and 0 · (z − m) stays 0
        b_z = tl.where(m_keep, b_z, _M_INIT)  # [BN, BV]
        b_mn = tl.maximum(b_m, tl.max(b_z, axis=1))
        b_alpha = tl.exp(b_m - b_mn)
        b_zc = b_z - b_mn[:, None]
        b_p = tl.exp(b_zc)  # [BN, BV]
        if HAS_ENTROPY:
            b_t = b_alpha * (b_t + (b_m - b_mn) * b_s) + tl.sum(tl.where(b_p > 0.0, b_p * b_zc, 0.0), axis=1)
        b_s = b_alpha * b_s + tl.sum(b_p, axis=1)
        b_m = b_mn

    o_out = i_s.to(tl.int64) * N + o_n
    tl.store(part_m + o_out, b_m, mask=m_n)
    tl.store(part_s + o_out, b_s, mask=m_n)
    if HAS_ENTROPY:
        tl.store(part_t + o_out, b_t, mask=m_n)
    if i_s == 0:
        b_zt = _target_logit(
            hidden, weight, bias, b_y, o_n, m_n, V, D, b_scale, softcap,
            stride_hn, stride_hd, stride_wv, stride_wd, stride_b, HAS_BIAS, HAS_SOFTCAP, BLOCK_N, BLOCK_D,
        )  # fmt: skip
        tl.store(target_z + o_n, b_zt, mask=m_n)


def _split_sum(x, ordered: bool):
    # Σ over the splits (dim 0); `ordered`: split by split, elementwise, so a row's order never follows N (a
    # reduction kernel may pick its tree by the shape)
    if not ordered:
        return x.sum(0)
    total = x[0].clone()
    for part in x[1:]:
        total += part
    return total


def merge_partials(part_m, part_s, part_t, target_z, valid, ordered: bool = False):
    """Combine `[splits, N]` partials and the `[N]` target logits into (logp, lse, entropy or None).

    Ignored rows get 0. `ordered`: sum the splits in a fixed order (batch invariance, docs/math.md §1.2).
    """
    b_m = part_m.amax(0)
    scale = torch.exp(part_m - b_m)
    s = _split_sum(scale * part_s, ordered)
    lse = b_m + torch.log(s)
    zero = torch.zeros((), dtype=torch.float32, device=lse.device)
    logp = torch.where(valid, target_z - lse, zero)
    entropy = None
    if part_t is not None:
        t = _split_sum(scale * (part_t + (part_m - b_m) * part_s), ordered)
        entropy = torch.where(valid, torch.log(s) - t / s, zero)
    return logp, lse, entropy


def _choose_splits(n_tokens: int, vocab: int, block_n: int, block_v: int, device: torch.device) -> int:
    """Vocab splits: at least FWD_MIN_SPLITS, and enough for FWD_WAVES programs per SM at small N."""
    n_blocks = triton.cdiv(n_tokens, block_n)
    want = max(configs.FWD_MIN_SPLITS, triton.cdiv(configs.FWD_WAVES * configs.sm_count(device), n_blocks))
    return max(1, min(want, triton.cdiv(vocab, block_v)))


def logprob_partials(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None,
    params: LogprobParams,
    theta: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The kernel's own output: `[splits, N]` m, s, t (None without entropy) and the `[N]` target logits.

    The statistics are over the kept set {v : z[n, v] ≥ theta[n]} when `theta` (`[N]` float32) is given, with
    z = softcap(h·W + b)·row_scale[n] / τ (`row_scale` `[N]` float32 or None). A target outside [0, V) gets
    target logit 0 (the vocab-parallel path relies on it).
    """
    n, d = hidden.shape
    v = weight.shape[0]
    name = configs.logprob_kernel("logprob_fwd", False, hidden.dtype != weight.dtype)
    invariant = params.batch_invariant
    fn, kwargs = configs.kernel_and_kwargs(name, logprob_fwd_kernel, hidden.device, tune=not invariant)
    cfg = configs.default_config(name, hidden.device).kwargs
    if invariant:  # one split of the vocabulary for every N and every GPU
        n_splits = max(1, min(configs.FWD_INVARIANT_SPLITS, triton.cdiv(v, cfg["BLOCK_V"])))
    else:
        n_splits = _choose_splits(n, v, cfg["BLOCK_N"], cfg["BLOCK_V"], hidden.device)
    part_m, part_s = (configs.alloc((n_splits, n), torch.float32, hidden.device) for _ in range(2))
    part_t = configs.alloc((n_splits, n), torch.float32, hidden.device) if params.return_entropy else None
    target_z = configs.alloc((n,), torch.float32, hidden.device)

    def grid(meta):
        return (n_splits * triton.cdiv(n, meta["BLOCK_N"]),)

    fn[grid](
        hidden, weight, bias, targets, part_m, part_s, part_t, target_z, theta, row_scale,
        n, v, d, n_splits, 1.0 / params.temperature, params.softcap or 1.0, configs.token_bucket(n),
        hidden.stride(0), hidden.stride(1), weight.stride(0), weight.stride(1),
        bias.stride(0) if bias is not None else 0, targets.stride(0),
        HAS_SOFTCAP=params.softcap is not None, **dot_flags(hidden, weight), **kwargs,
    )  # fmt: skip
    return part_m, part_s, part_t, target_z


def logprob_forward(hidden, weight, targets, bias, params: LogprobParams, **options):
    """`[N, D]`, `[V, D]`, `[N]`, `[V]`|None → (logp `[N]`, lse `[N]`, entropy `[N]`|None), float32.

    `options`: `logprob_partials`' theta, row_scale (with `theta`, lse and entropy are the kept set's).
    """
    part_m, part_s, part_t, target_z = logprob_partials(hidden, weight, targets, bias, params, **options)
    valid = targets != params.ignore_index
    logp, lse, entropy = merge_partials(part_m, part_s, part_t, target_z, valid, ordered=params.batch_invariant)
    return logp, lse, entropy
