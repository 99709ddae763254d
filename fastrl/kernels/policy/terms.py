"""The token-level Triton code the policy-loss forward and backward kernels share (docs/math.md §2).

`load_row_block` reads one `[BLOCK_T]` block of a row and neutralizes its masked positions;
`token_terms` gives ℓ and its partial derivatives per token (`kl_terms` the KL estimate's), and
`block_terms` is one step of both kernels' row walks: a block loaded, its ratio formed, its terms;
`row_log_ratio` is the masked mean log ratio of a sequence-level ratio. `launch_args` turns a
`PolicyLossParams` into the kernels' runtime scalars (eps, c, β, α, τ, the KL clamp: a new value never
recompiles) and constexpr flags. `weight` is the detached per-token factor of the policy term
(importance weights and masks, computed by the caller).
"""

import torch
import triton
import triton.language as tl

from .. import configs
from .params import KL_CODES, PG_CODES, SAPO_SATURATED, PolicyLossParams

__all__ = [
    "OPTIONAL_INPUTS",
    "block_terms",
    "kl_terms",
    "launch_args",
    "load_row_block",
    "row_log_ratio",
    "token_terms",
]

# Optional inputs become constexpr flags: a None pointer compiles its branch away.
OPTIONAL_INPUTS = {
    "HAS_OLD": lambda args: args["old"] is not None,
    "HAS_REF": lambda args: args["ref"] is not None,
    "HAS_WEIGHT": lambda args: args["weight"] is not None,
    "HAS_ENTROPY": lambda args: args["entropy"] is not None,
}
_SAPO_SATURATED = tl.constexpr(SAPO_SATURATED)


@triton.jit
def load_row_block(logp, old, ref, weight, entropy, adv, mask, row, o_t, m_t, b_adv_row,
                    HAS_OLD: tl.constexpr, HAS_REF: tl.constexpr, HAS_WEIGHT: tl.constexpr,
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
    b_w = tl.where(b_m, 1.0, 0.0)
    if HAS_WEIGHT:
        b_w = tl.where(b_m, tl.load(weight + row + o_t, mask=m_t, other=0.0).to(tl.float32), 0.0)
    b_h = tl.zeros_like(b_lp)
    if HAS_ENTROPY:
        b_h = tl.where(b_m, tl.load(entropy + row + o_t, mask=m_t, other=0.0).to(tl.float32), 0.0)
    return b_m, b_lp, b_old, b_adv, b_ref, b_w, b_h


@triton.jit
def kl_terms(b_rho, kl_clip, HAS_KL_CLIP: tl.constexpr, KL: tl.constexpr):
    # (KL estimate, ∂kl/∂logp) from ρ = ref − logp
    if KL == 1 or KL == 5:
        b_kl = -b_rho
        b_d = tl.full(b_rho.shape, 1.0, tl.float32)
    elif KL == 2:
        b_kl = 0.5 * b_rho * b_rho
        b_d = -b_rho
    elif KL == 4:
        b_kl = tl.abs(b_rho)
        b_d = tl.where(b_rho > 0, -1.0, tl.where(b_rho < 0, 1.0, 0.0))
    else:
        # exp(ρ) − 1 − ρ cancels catastrophically in fp32 for small ρ (3.5× too large at |ρ| ~ 1e-4,
        # the KL right after init): Taylor series there (truncation < 1e-6 relative at |ρ| = 0.5)
        b_q = 1.0 / 24 + b_rho * (1.0 / 120 + b_rho * (1.0 / 720 + b_rho / 5040))
        b_q = 0.5 + b_rho * (1.0 / 6 + b_rho * b_q)  # (exp(ρ) − 1 − ρ) / ρ², to ρ⁵
        b_kl = tl.where(tl.abs(b_rho) < 0.5, b_rho * b_rho * b_q, tl.exp(b_rho) - 1.0 - b_rho)
        b_d = -(b_kl + b_rho)  # −(exp(ρ) − 1)
    if HAS_KL_CLIP:
        b_out = (b_kl > kl_clip) | (b_kl < -kl_clip)
        b_kl = tl.minimum(tl.maximum(b_kl, -kl_clip), kl_clip)
        b_d = tl.where(b_out, 0.0, b_d)
    if KL == 5 or KL == 6:
        b_d = -b_rho  # straight-through: the gradient of ρ²/2
    return b_kl, b_d


@triton.jit
def token_terms(b_r, b_adv, b_lp, b_ref, b_w, b_h, eps_low, eps_high, dual_clip, beta, kl_clip, entropy_coef,
                 tau_pos, tau_neg, PG: tl.constexpr, HAS_DUAL: tl.constexpr, HAS_REF: tl.constexpr,
                 HAS_ENTROPY: tl.constexpr, KL: tl.constexpr, HAS_KL_CLIP: tl.constexpr,
                 KL_BIAS: tl.constexpr):  # fmt: skip
    # ℓ and its partial derivatives: d_r = ∂ℓ/∂r (through the ratio), d_lp = ∂ℓ/∂logp (direct)
    b_low = (b_adv < 0) & (b_r < 1.0 - eps_low)
    b_high = (b_adv > 0) & (b_r > 1.0 + eps_high)
    b_dual = b_low & b_high  # all False: the two clips never bind on one token
    b_d_lp = tl.zeros_like(b_r)
    if PG == 0:
        b_clipped = tl.minimum(tl.maximum(b_r, 1.0 - eps_low), 1.0 + eps_high)
        b_pg = tl.maximum(-b_r * b_adv, -b_clipped * b_adv)
        b_d_r = tl.where(b_low | b_high, 0.0, -b_adv)
        if HAS_DUAL:
            b_dual = (b_adv < 0) & (b_pg > -dual_clip * b_adv)
            b_pg = tl.where(b_dual, -dual_clip * b_adv, b_pg)
            b_d_r = tl.where(b_dual, 0.0, b_d_r)
    elif PG == 1:
        b_low = b_dual
        b_high = b_dual
        b_tau = tl.where(b_adv > 0, tau_pos, tau_neg)
        b_z = b_tau * (b_r - 1.0)
        b_gate = tl.sigmoid(b_z)
        b_pg = -(4.0 / b_tau) * b_gate * b_adv
        b_d_r = tl.where(b_z > _SAPO_SATURATED, 0.0, -4.0 * b_gate * (1.0 - b_gate) * b_adv)
    else:
        b_low = b_dual
        b_high = b_dual
        b_pg = -b_adv * b_lp
        b_d_r = tl.zeros_like(b_r)
        b_d_lp = -b_adv * b_w
    b_loss = b_w * b_pg
    b_d_r = b_w * b_d_r
    b_kl = tl.zeros_like(b_r)
    if HAS_REF:
        b_kl, b_d_kl = kl_terms(b_ref - b_lp, kl_clip, HAS_KL_CLIP, KL)
        # A ref given only for the metric must not leak an overflowed kl into the loss through 0·inf.
        if KL_BIAS:
            b_loss += tl.where(beta != 0.0, beta * b_kl * b_r, 0.0)
            b_d_r += tl.where(beta != 0.0, beta * b_kl, 0.0)
            b_d_lp += tl.where(beta != 0.0, beta * b_d_kl * b_r, 0.0)
        else:
            b_loss += tl.where(beta != 0.0, beta * b_kl, 0.0)
            b_d_lp += tl.where(beta != 0.0, beta * b_d_kl, 0.0)
    if HAS_ENTROPY:
        b_loss -= tl.where(entropy_coef != 0.0, entropy_coef * b_h, 0.0)
    return b_loss, b_d_r, b_d_lp, b_low, b_high, b_dual, b_kl


@triton.jit
def block_terms(logp, old, ref, weight, entropy, adv, mask, row, start, T, b_adv_row, b_seq_lr,
                eps_low, eps_high, dual_clip, beta, kl_clip, entropy_coef, tau_pos, tau_neg,
                HAS_OLD: tl.constexpr, HAS_REF: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_ENTROPY: tl.constexpr,
                HAS_DUAL: tl.constexpr, ADV_PER_TOKEN: tl.constexpr, PG: tl.constexpr, SEQ_RATIO: tl.constexpr,
                KL: tl.constexpr, HAS_KL_CLIP: tl.constexpr, KL_BIAS: tl.constexpr, BLOCK_T: tl.constexpr):  # fmt: skip
    # the `[BLOCK_T]` block of a row from `start`: its log ratio (the sequence's under SEQ_RATIO), ratio and
    # token terms; what a kernel does not use is compiled away
    o_t = start + tl.arange(0, BLOCK_T)
    m_t = o_t < T
    b_m, b_lp, b_old, b_adv, b_ref, b_w, b_h = load_row_block(
        logp, old, ref, weight, entropy, adv, mask, row, o_t, m_t, b_adv_row,
        HAS_OLD, HAS_REF, HAS_WEIGHT, HAS_ENTROPY, ADV_PER_TOKEN,
    )  # fmt: skip
    if SEQ_RATIO:
        b_lr = tl.where(b_m, b_seq_lr, 0.0)
    else:
        b_lr = b_lp - b_old
    b_r = tl.exp(b_lr)
    b_loss, b_d_r, b_d_lp, b_low, b_high, b_dual, b_kl = token_terms(
        b_r, b_adv, b_lp, b_ref, b_w, b_h, eps_low, eps_high, dual_clip, beta, kl_clip, entropy_coef,
        tau_pos, tau_neg, PG, HAS_DUAL, HAS_REF, HAS_ENTROPY, KL, HAS_KL_CLIP, KL_BIAS,
    )  # fmt: skip
    return o_t, m_t, b_m, b_lr, b_r, b_w, b_h, b_loss, b_d_r, b_d_lp, b_low, b_high, b_dual, b_kl


@triton.jit
def row_log_ratio(logp, old, mask, row, T, HAS_OLD: tl.constexpr, BLOCK_T: tl.constexpr):
    # sequence-level ratio: Σ_t m·δ / max(Σ_t m, 1) over the row
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


def launch_args(logp, advantages, mask, old, ref, weight, entropy, params: PolicyLossParams):
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
        kl_clip=0.0 if params.kl_clip is None else float(params.kl_clip),
        entropy_coef=float(params.entropy_coef),
        tau_pos=float(params.sapo_tau_pos),
        tau_neg=float(params.sapo_tau_neg),
    )
    flags = dict(
        HAS_DUAL=params.dual_clip is not None and params.pg == "clip",
        ADV_PER_TOKEN=advantages.dim() == 2,
        PG=PG_CODES[params.pg],
        SEQ_RATIO=params.ratio_level != "token",
        SEQ_GRAD=params.ratio_level == "sequence",
        KL=KL_CODES[params.kl],
        HAS_KL_CLIP=params.kl_clip is not None,
        KL_BIAS=params.kl_bias_correction,
        BLOCK_T=min(configs.POLICY_MAX_BLOCK_T, triton.next_power_of_2(max(logp.shape[1], configs.POLICY_MIN_BLOCK_T))),
    )
    return (c(logp), c(old), c(ref), c(weight), c(entropy), c(advantages), mask), scalars, flags
