"""The token-level Triton code the policy-loss forward and backward kernels share (docs/math.md §2).

`load_row_block` reads one `[BLOCK_T]` block of a row and neutralizes its masked positions;
`token_terms` gives ℓ and its partial derivatives per token; `row_log_ratio` is GSPO's masked mean
log ratio. `launch_args` turns a `PolicyLossParams` into the kernels' runtime scalars (eps, c, β, α,
C: a new value never recompiles) and constexpr flags.
"""

import torch
import triton
import triton.language as tl

from .. import configs
from .params import KL_CODES, PolicyLossParams

__all__ = ["OPTIONAL_INPUTS", "launch_args", "load_row_block", "row_log_ratio", "token_terms"]

# Optional inputs become constexpr flags: a None pointer compiles its branch away.
OPTIONAL_INPUTS = {
    "HAS_OLD": lambda args: args["old"] is not None,
    "HAS_REF": lambda args: args["ref"] is not None,
    "HAS_ROLLOUT": lambda args: args["rollout"] is not None,
    "HAS_ENTROPY": lambda args: args["entropy"] is not None,
}


@triton.jit
def load_row_block(logp, old, ref, rollout, entropy, adv, mask, row, o_t, m_t, b_adv_row,
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
def token_terms(b_r, b_adv, b_lp, b_ref, b_log_w, b_h, eps_low, eps_high, dual_clip, beta, entropy_coef, is_cap,
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
def row_log_ratio(logp, old, mask, row, T, HAS_OLD: tl.constexpr, BLOCK_T: tl.constexpr):
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


def launch_args(logp, advantages, mask, old, ref, rollout, entropy, params: PolicyLossParams):
    """Contiguous tensors, runtime scalars and constexpr flags of one launch (forward or backward)."""

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
        BLOCK_T=min(configs.POLICY_MAX_BLOCK_T, triton.next_power_of_2(max(logp.shape[1], configs.POLICY_MIN_BLOCK_T))),
    )
    return (c(logp), c(old), c(ref), c(rollout), c(entropy), c(advantages), mask), scalars, flags
