"""Fused per-token policy loss (SPEC §2): one program per sequence, forward and backward.

Each program walks its row in `[BLOCK_T]` blocks, computes ratio, clipping, dual clip, IS weight,
KL and entropy terms in float32 and reduces them to the row's masked sums: the loss Σ_t m·ℓ and the
`STATS` columns (see policy_loss_torch). The aggregation over rows (SPEC §3) is a handful of `[B]`
ops outside. Backward recomputes the token terms from the inputs (nothing `[B, T]` is saved
beyond them) and takes the upstream gradient per row, dL/d(row_loss). GSPO's sequence ratio
needs the row's masked mean log ratio first: the forward stores it per row for the backward.

Optional inputs are constexpr flags (None pointers); eps, beta, c, α and C are runtime arguments.
"""

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from .policy_loss_torch import KL_CODES, STATS, PolicyLossParams

NUM_STATS: int = len(STATS)
MAX_BLOCK_T = 1024
# 8 warps keep the forward's ten [BLOCK_T] accumulators at 4 registers each per thread (no spills at 1024).
NUM_WARPS = 8


@triton.jit
def _load_row_block(logp, old, ref, rollout, entropy, adv, mask, row, o_t, m_t, b_adv_row,
                    HAS_OLD: tl.constexpr, HAS_REF: tl.constexpr, HAS_ROLLOUT: tl.constexpr,
                    HAS_ENTROPY: tl.constexpr, ADV_PER_TOKEN: tl.constexpr):  # fmt: skip
    # Masked and out-of-range positions become neutral values BEFORE any exp: no 0·inf anywhere.
    b_m = (tl.load(mask + row + o_t, mask=m_t, other=0) != 0) & m_t
    b_lp = tl.where(b_m, tl.load(logp + row + o_t, mask=m_t, other=0.0).to(tl.float32), 0.0)
    b_old = b_lp
    if HAS_OLD:
        b_old = tl.where(b_m, tl.load(old + row + o_t, mask=m_t, other=0.0).to(tl.float32), 0.0)
    if ADV_PER_TOKEN:
        b_adv = tl.where(b_m, tl.load(adv + row + o_t, mask=m_t, other=0.0).to(tl.float32), 0.0)
    else:
        b_adv = tl.where(b_m, b_adv_row, 0.0)
    b_ref = b_lp
    if HAS_REF:
        b_ref = tl.where(b_m, tl.load(ref + row + o_t, mask=m_t, other=0.0).to(tl.float32), 0.0)
    b_log_w = tl.zeros_like(b_lp)
    if HAS_ROLLOUT:
        b_roll = tl.load(rollout + row + o_t, mask=m_t, other=0.0).to(tl.float32)
        b_log_w = tl.where(b_m, b_old - b_roll, 0.0)
    b_h = tl.zeros_like(b_lp)
    if HAS_ENTROPY:
        b_h = tl.where(b_m, tl.load(entropy + row + o_t, mask=m_t, other=0.0).to(tl.float32), 0.0)
    return b_m, b_lp, b_old, b_adv, b_ref, b_log_w, b_h


@triton.jit
def _token_terms(b_r, b_adv, b_lp, b_ref, b_log_w, b_h, eps_low, eps_high, dual_clip, beta, entropy_coef, is_cap,
                 HAS_DUAL: tl.constexpr, HAS_REF: tl.constexpr, HAS_ROLLOUT: tl.constexpr,
                 HAS_ENTROPY: tl.constexpr, KL: tl.constexpr):  # fmt: skip
    # ℓ and its partial derivatives: d_pg = ∂(w·pg)/∂r, d_kl = ∂(β·kl)/∂logp.
    b_low = (b_adv < 0) & (b_r < 1.0 - eps_low)
    b_high = (b_adv > 0) & (b_r > 1.0 + eps_high)
    b_clipped = tl.minimum(tl.maximum(b_r, 1.0 - eps_low), 1.0 + eps_high)
    b_pg = tl.maximum(-b_r * b_adv, -b_clipped * b_adv)
    b_d_pg = tl.where(b_low | b_high, 0.0, -b_adv)
    b_dual = b_low & b_high  # all False: the two clips never bind on one token
    if HAS_DUAL:
        b_dual = (b_adv < 0) & (b_pg > -dual_clip * b_adv)
        b_pg = tl.where(b_dual, -dual_clip * b_adv, b_pg)
        b_d_pg = tl.where(b_dual, 0.0, b_d_pg)
    b_w = tl.full(b_r.shape, 1.0, tl.float32)
    if HAS_ROLLOUT:
        b_w = tl.minimum(tl.exp(b_log_w), is_cap)
        b_pg = b_w * b_pg
        b_d_pg = b_w * b_d_pg
    b_loss = b_pg
    b_kl = tl.zeros_like(b_r)
    b_d_kl = tl.zeros_like(b_r)
    if HAS_REF:
        b_rho = b_ref - b_lp
        if KL == 1:
            b_kl = -b_rho
            b_d_kl = tl.full(b_r.shape, 1.0, tl.float32)
        elif KL == 2:
            b_kl = 0.5 * b_rho * b_rho
            b_d_kl = -b_rho
        else:
            # exp(ρ) − 1 − ρ cancels catastrophically in fp32 for small ρ (3.5× too large at |ρ| ~ 1e-4,
            # the KL right after init): Taylor series there (truncation < 1e-6 relative at |ρ| = 0.5)
            b_q = 1.0 / 24 + b_rho * (1.0 / 120 + b_rho * (1.0 / 720 + b_rho / 5040))
            b_q = 0.5 + b_rho * (1.0 / 6 + b_rho * b_q)  # (exp(ρ) − 1 − ρ) / ρ², to ρ⁵
            b_kl = tl.where(tl.abs(b_rho) < 0.5, b_rho * b_rho * b_q, tl.exp(b_rho) - 1.0 - b_rho)
            b_em1 = b_kl + b_rho  # exp(ρ) − 1
            b_d_kl = -b_em1
        # A ref given only for the metric must not leak an overflowed kl into the loss through 0·inf.
        b_loss += tl.where(beta != 0.0, beta * b_kl, 0.0)
        b_d_kl = tl.where(beta != 0.0, beta * b_d_kl, 0.0)
    if HAS_ENTROPY:
        b_loss -= tl.where(entropy_coef != 0.0, entropy_coef * b_h, 0.0)
    return b_loss, b_d_pg, b_d_kl, b_low, b_high, b_dual, b_w, b_kl


@triton.jit
def _row_log_ratio(logp, old, mask, row, T, HAS_OLD: tl.constexpr, BLOCK_T: tl.constexpr):
    # GSPO: Σ_t m·δ / max(Σ_t m, 1) over the row
    b_sum = tl.zeros([BLOCK_T], dtype=tl.float32)
    b_cnt = tl.zeros([BLOCK_T], dtype=tl.float32)
    if HAS_OLD:
        for start in range(0, T, BLOCK_T):
            o_t = start + tl.arange(0, BLOCK_T)
            m_t = o_t < T
            b_m = (tl.load(mask + row + o_t, mask=m_t, other=0) != 0) & m_t
            b_lp = tl.load(logp + row + o_t, mask=m_t, other=0.0).to(tl.float32)
            b_old = tl.load(old + row + o_t, mask=m_t, other=0.0).to(tl.float32)
            b_sum += tl.where(b_m, b_lp - b_old, 0.0)
            b_cnt += b_m.to(tl.float32)
    return tl.sum(b_sum, axis=0) / tl.maximum(tl.sum(b_cnt, axis=0), 1.0)


@triton.heuristics(
    {
        "HAS_OLD": lambda args: args["old"] is not None,
        "HAS_REF": lambda args: args["ref"] is not None,
        "HAS_ROLLOUT": lambda args: args["rollout"] is not None,
        "HAS_ENTROPY": lambda args: args["entropy"] is not None,
    }
)
@triton.jit
def policy_fwd_kernel(logp, old, ref, rollout, entropy, adv, mask, row_loss, stats, seq_log_ratio, T,
                      eps_low, eps_high, dual_clip, beta, entropy_coef, is_cap,
                      HAS_OLD: tl.constexpr, HAS_REF: tl.constexpr, HAS_ROLLOUT: tl.constexpr,
                      HAS_ENTROPY: tl.constexpr, HAS_DUAL: tl.constexpr, ADV_PER_TOKEN: tl.constexpr,
                      SEQ_RATIO: tl.constexpr, KL: tl.constexpr, NUM_STATS: tl.constexpr,
                      BLOCK_T: tl.constexpr):  # fmt: skip
    i_b = tl.program_id(0).to(tl.int64)
    row = i_b * T
    b_adv_row = 0.0
    if not ADV_PER_TOKEN:
        b_adv_row = tl.load(adv + i_b).to(tl.float32)
    b_seq_lr = 0.0
    if SEQ_RATIO:
        b_seq_lr = _row_log_ratio(logp, old, mask, row, T, HAS_OLD, BLOCK_T)
        tl.store(seq_log_ratio + i_b, b_seq_lr)
    b_acc_loss = tl.zeros([BLOCK_T], dtype=tl.float32)
    b_acc_tok = tl.zeros([BLOCK_T], dtype=tl.float32)
    b_acc_low = tl.zeros([BLOCK_T], dtype=tl.float32)
    b_acc_high = tl.zeros([BLOCK_T], dtype=tl.float32)
    b_acc_dual = tl.zeros([BLOCK_T], dtype=tl.float32)
    b_acc_r = tl.zeros([BLOCK_T], dtype=tl.float32)
    b_acc_alr = tl.zeros([BLOCK_T], dtype=tl.float32)
    b_acc_kl = tl.zeros([BLOCK_T], dtype=tl.float32)
    b_acc_h = tl.zeros([BLOCK_T], dtype=tl.float32)
    b_acc_w = tl.zeros([BLOCK_T], dtype=tl.float32)
    for start in range(0, T, BLOCK_T):
        o_t = start + tl.arange(0, BLOCK_T)
        m_t = o_t < T
        b_m, b_lp, b_old, b_adv, b_ref, b_log_w, b_h = _load_row_block(
            logp, old, ref, rollout, entropy, adv, mask, row, o_t, m_t, b_adv_row,
            HAS_OLD, HAS_REF, HAS_ROLLOUT, HAS_ENTROPY, ADV_PER_TOKEN,
        )  # fmt: skip
        if SEQ_RATIO:
            b_lr = tl.full([BLOCK_T], 0.0, tl.float32) + b_seq_lr
        else:
            b_lr = b_lp - b_old
        b_r = tl.exp(b_lr)
        b_loss, b_d_pg, b_d_kl, b_low, b_high, b_dual, b_w, b_kl = _token_terms(
            b_r, b_adv, b_lp, b_ref, b_log_w, b_h, eps_low, eps_high, dual_clip, beta, entropy_coef, is_cap,
            HAS_DUAL, HAS_REF, HAS_ROLLOUT, HAS_ENTROPY, KL,
        )  # fmt: skip
        b_mf = b_m.to(tl.float32)
        b_acc_loss += tl.where(b_m, b_loss, 0.0)
        b_acc_tok += b_mf
        b_acc_low += (b_low & b_m).to(tl.float32)
        b_acc_high += (b_high & b_m).to(tl.float32)
        b_acc_dual += (b_dual & b_m).to(tl.float32)
        b_acc_r += tl.where(b_m, b_r, 0.0)
        b_acc_alr += tl.where(b_m, tl.abs(b_lr), 0.0)
        b_acc_kl += tl.where(b_m, b_kl, 0.0)
        b_acc_h += b_h
        b_acc_w += tl.where(b_m, b_w, 0.0)
    tl.store(row_loss + i_b, tl.sum(b_acc_loss, axis=0))
    p_s = stats + i_b * NUM_STATS
    tl.store(p_s + 0, tl.sum(b_acc_tok, axis=0))
    tl.store(p_s + 1, tl.sum(b_acc_low, axis=0))
    tl.store(p_s + 2, tl.sum(b_acc_high, axis=0))
    tl.store(p_s + 3, tl.sum(b_acc_dual, axis=0))
    tl.store(p_s + 4, tl.sum(b_acc_r, axis=0))
    tl.store(p_s + 5, tl.sum(b_acc_alr, axis=0))
    tl.store(p_s + 6, tl.sum(b_acc_kl, axis=0))
    tl.store(p_s + 7, tl.sum(b_acc_h, axis=0))
    tl.store(p_s + 8, tl.sum(b_acc_w, axis=0))


@triton.heuristics(
    {
        "HAS_OLD": lambda args: args["old"] is not None,
        "HAS_REF": lambda args: args["ref"] is not None,
        "HAS_ROLLOUT": lambda args: args["rollout"] is not None,
        "HAS_ENTROPY": lambda args: args["entropy"] is not None,
    }
)
@triton.jit
def policy_bwd_kernel(logp, old, ref, rollout, entropy, adv, mask, seq_log_ratio, grad_row, d_logp, d_entropy, T,
                      eps_low, eps_high, dual_clip, beta, entropy_coef, is_cap,
                      HAS_OLD: tl.constexpr, HAS_REF: tl.constexpr, HAS_ROLLOUT: tl.constexpr,
                      HAS_ENTROPY: tl.constexpr, HAS_DUAL: tl.constexpr, ADV_PER_TOKEN: tl.constexpr,
                      SEQ_RATIO: tl.constexpr, KL: tl.constexpr, BLOCK_T: tl.constexpr):  # fmt: skip
    i_b = tl.program_id(0).to(tl.int64)
    row = i_b * T
    b_g = tl.load(grad_row + i_b).to(tl.float32)
    b_adv_row = 0.0
    if not ADV_PER_TOKEN:
        b_adv_row = tl.load(adv + i_b).to(tl.float32)
    b_seq_lr = 0.0
    b_seq_coef = 0.0
    if SEQ_RATIO:
        # ∂r_seq/∂logp_t = r_seq·m_t/n: every token's gradient carries Σ_u m_u·∂(w·pg)_u/∂r
        b_seq_lr = tl.load(seq_log_ratio + i_b)
        b_seq_r = tl.exp(b_seq_lr)
        b_acc = tl.zeros([BLOCK_T], dtype=tl.float32)
        b_cnt = tl.zeros([BLOCK_T], dtype=tl.float32)
        for start in range(0, T, BLOCK_T):
            o_t = start + tl.arange(0, BLOCK_T)
            m_t = o_t < T
            b_m, b_lp, b_old, b_adv, b_ref, b_log_w, b_h = _load_row_block(
                logp, old, ref, rollout, entropy, adv, mask, row, o_t, m_t, b_adv_row,
                HAS_OLD, HAS_REF, HAS_ROLLOUT, HAS_ENTROPY, ADV_PER_TOKEN,
            )  # fmt: skip
            b_r = tl.full([BLOCK_T], 0.0, tl.float32) + b_seq_r
            _, b_d_pg, _, _, _, _, _, _ = _token_terms(
                b_r, b_adv, b_lp, b_ref, b_log_w, b_h, eps_low, eps_high, dual_clip, beta, entropy_coef, is_cap,
                HAS_DUAL, HAS_REF, HAS_ROLLOUT, HAS_ENTROPY, KL,
            )  # fmt: skip
            b_acc += tl.where(b_m, b_d_pg, 0.0)
            b_cnt += b_m.to(tl.float32)
        # a row whose tokens are all clipped has Σ = 0: its gradient is 0 even when r_seq overflowed
        b_sum = tl.sum(b_acc, axis=0)
        b_seq_coef = tl.where(b_sum == 0.0, 0.0, b_sum * b_seq_r / tl.maximum(tl.sum(b_cnt, axis=0), 1.0))
    for start in range(0, T, BLOCK_T):
        o_t = start + tl.arange(0, BLOCK_T)
        m_t = o_t < T
        b_m, b_lp, b_old, b_adv, b_ref, b_log_w, b_h = _load_row_block(
            logp, old, ref, rollout, entropy, adv, mask, row, o_t, m_t, b_adv_row,
            HAS_OLD, HAS_REF, HAS_ROLLOUT, HAS_ENTROPY, ADV_PER_TOKEN,
        )  # fmt: skip
        if SEQ_RATIO:
            b_lr = tl.full([BLOCK_T], 0.0, tl.float32) + b_seq_lr
        else:
            b_lr = b_lp - b_old
        b_r = tl.exp(b_lr)
        _, b_d_pg, b_d_kl, _, _, _, _, _ = _token_terms(
            b_r, b_adv, b_lp, b_ref, b_log_w, b_h, eps_low, eps_high, dual_clip, beta, entropy_coef, is_cap,
            HAS_DUAL, HAS_REF, HAS_ROLLOUT, HAS_ENTROPY, KL,
        )  # fmt: skip
        if SEQ_RATIO:
            b_d = b_seq_coef + b_d_kl
        else:
            # a clipped token (d_pg = 0) stays at 0 when r overflowed: no 0·inf
            b_d = tl.where(b_d_pg == 0.0, 0.0, b_d_pg * b_r) + b_d_kl
        b_d = tl.where(b_m, b_g * b_d, 0.0)
        tl.store(d_logp + row + o_t, b_d.to(d_logp.dtype.element_ty), mask=m_t)
        if HAS_ENTROPY:
            b_de = tl.where(b_m, -entropy_coef * b_g, 0.0)
            tl.store(d_entropy + row + o_t, b_de.to(d_entropy.dtype.element_ty), mask=m_t)


def _prepare(logp, advantages, mask, old, ref, rollout, entropy, params: PolicyLossParams):
    def c(t):
        return None if t is None else t.contiguous()

    mask = mask.contiguous()
    if mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)
    scalars = dict(
        eps_low=float(params.eps_low),
        eps_high=float(params.eps_high),
        dual_clip=0.0 if params.dual_clip is None else float(params.dual_clip),
        beta=float(params.beta),
        entropy_coef=float(params.entropy_coef),
        is_cap=0.0 if params.is_cap is None else float(params.is_cap),
    )
    flags = dict(
        HAS_DUAL=params.dual_clip is not None,
        ADV_PER_TOKEN=advantages.dim() == 2,
        SEQ_RATIO=params.seq_ratio,
        KL=KL_CODES[params.kl],
        BLOCK_T=min(MAX_BLOCK_T, triton.next_power_of_2(max(logp.shape[1], 16))),
    )
    return (c(logp), c(old), c(ref), c(rollout), c(entropy), c(advantages), mask), scalars, flags


def policy_fwd(logp, advantages, mask, old, ref, rollout, entropy, params: PolicyLossParams):
    """Launch the forward: → row_loss `[B]`, stats `[B, NUM_STATS]`, seq_log_ratio `[B]` (float32)."""
    B, T = logp.shape
    tensors, scalars, flags = _prepare(logp, advantages, mask, old, ref, rollout, entropy, params)
    dev = logp.device
    row_loss = torch.full((B,), float("nan"), dtype=torch.float32, device=dev)
    stats = torch.full((B, NUM_STATS), float("nan"), dtype=torch.float32, device=dev)
    seq_log_ratio = torch.zeros(B, dtype=torch.float32, device=dev)
    if B > 0:
        policy_fwd_kernel[(B,)](
            *tensors, row_loss, stats, seq_log_ratio, T, **scalars, NUM_STATS=NUM_STATS, **flags, num_warps=NUM_WARPS
        )
    return row_loss, stats, seq_log_ratio


def policy_bwd(logp, advantages, mask, old, ref, rollout, entropy, seq_log_ratio, grad_row, params):
    """Launch the backward: → d_logp `[B, T]` (logp's dtype), d_entropy `[B, T]` or None."""
    B, T = logp.shape
    tensors, scalars, flags = _prepare(logp, advantages, mask, old, ref, rollout, entropy, params)
    d_logp = torch.empty_like(logp, memory_format=torch.contiguous_format)
    d_entropy = None if entropy is None else torch.empty_like(entropy, memory_format=torch.contiguous_format)
    if B > 0:
        policy_bwd_kernel[(B,)](
            *tensors, seq_log_ratio, grad_row.float().contiguous(), d_logp, d_entropy, T, **scalars, **flags,
            num_warps=NUM_WARPS,
        )  # fmt: skip
    return d_logp, d_entropy


class PolicyRowsFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, entropy, advantages, mask, old, ref, rollout, params: PolicyLossParams):
        old, ref, rollout, advantages = (None if t is None else t.detach() for t in (old, ref, rollout, advantages))
        row_loss, stats, seq_log_ratio = policy_fwd(logp, advantages, mask, old, ref, rollout, entropy, params)
        ctx.params = params
        ctx.save_for_backward(logp, entropy, advantages, mask, old, ref, rollout, seq_log_ratio)
        ctx.mark_non_differentiable(stats)
        return row_loss, stats

    @staticmethod
    @once_differentiable  # the backward is hand-written: a second derivative must raise, not be wrong
    def backward(ctx, grad_row, _grad_stats):
        logp, entropy, advantages, mask, old, ref, rollout, seq_log_ratio = ctx.saved_tensors
        d_logp, d_entropy = policy_bwd(
            logp, advantages, mask, old, ref, rollout, entropy, seq_log_ratio, grad_row, ctx.params
        )
        return d_logp, d_entropy, None, None, None, None, None, None


def policy_rows_triton(logp, advantages, mask, old, ref, rollout, entropy, params: PolicyLossParams):
    """Triton version of `policy_rows_torch`: same arguments, same (row_loss `[B]`, stats `[B, K]`)."""
    return PolicyRowsFunction.apply(logp, entropy, advantages, mask, old, ref, rollout, params)
