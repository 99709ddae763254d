"""Fused per-token policy loss, backward (docs/math.md §2): one program per sequence.

The token terms are recomputed from the inputs (nothing `[B, T]` is saved beyond them) and scaled
by the upstream gradient of the row, dL/d(row_loss). Under GSPO (ratio_level "sequence") every
token's gradient carries the row's sum of ∂ℓ/∂r, so the row is walked twice; GSPO-token
("sequence-token") takes the sequence ratio's value and each token's own gradient.
"""

import torch
import triton
import triton.language as tl

from .. import configs
from .params import PolicyLossParams
from .terms import OPTIONAL_INPUTS, block_terms, launch_args

__all__ = ["policy_bwd", "policy_bwd_kernel"]


@triton.heuristics(OPTIONAL_INPUTS)
@triton.jit
def policy_bwd_kernel(logp, old, ref, weight, entropy, adv, mask, seq_log_ratio, grad_row, d_logp, d_entropy, T,
                      eps_low, eps_high, dual_clip, beta, kl_clip, entropy_coef, tau_pos, tau_neg,
                      HAS_OLD: tl.constexpr, HAS_REF: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                      HAS_ENTROPY: tl.constexpr, HAS_DUAL: tl.constexpr, ADV_PER_TOKEN: tl.constexpr,
                      PG: tl.constexpr, SEQ_RATIO: tl.constexpr, SEQ_GRAD: tl.constexpr, KL: tl.constexpr,
                      HAS_KL_CLIP: tl.constexpr, KL_BIAS: tl.constexpr, BLOCK_T: tl.constexpr):  # fmt: skip
    i_b = tl.program_id(0).to(tl.int64)
    row = i_b * T
    b_g = tl.load(grad_row + i_b).to(tl.float32)
    b_adv_row = 0.0
    if not ADV_PER_TOKEN:
        b_adv_row = tl.load(adv + i_b).to(tl.float32)
    b_seq_lr = 0.0
    b_seq_coef = 0.0
    if SEQ_RATIO:
        b_seq_lr = tl.load(seq_log_ratio + i_b)
    if SEQ_GRAD:
        # GSPO: ∂r_seq/∂logp_t = r_seq·m_t/n, so every token's gradient carries Σ_u m_u·∂ℓ_u/∂r
        b_seq_r = tl.exp(b_seq_lr)
        b_acc = tl.zeros([BLOCK_T], dtype=tl.float32)
        b_cnt = tl.zeros([BLOCK_T], dtype=tl.float32)
        for start in range(0, T, BLOCK_T):
            # the sequence ratio r_seq on every live token (a masked one's term is dropped below)
            _, _, b_m, _, _, _, _, _, b_d_r, _, _, _, _, _ = block_terms(
                logp, old, ref, weight, entropy, adv, mask, row, start, T, b_adv_row, b_seq_lr,
                eps_low, eps_high, dual_clip, beta, kl_clip, entropy_coef, tau_pos, tau_neg,
                HAS_OLD, HAS_REF, HAS_WEIGHT, HAS_ENTROPY, HAS_DUAL, ADV_PER_TOKEN, PG, SEQ_RATIO, KL, HAS_KL_CLIP,
                KL_BIAS, BLOCK_T,
            )  # fmt: skip
            b_acc += tl.where(b_m, b_d_r, 0.0)
            b_cnt += b_m.to(tl.float32)
        # a row whose tokens are all clipped has Σ = 0: its gradient is 0 even when r_seq overflowed
        b_sum = tl.sum(b_acc, axis=0)
        b_seq_coef = tl.where(b_sum == 0.0, 0.0, b_sum * b_seq_r / tl.maximum(tl.sum(b_cnt, axis=0), 1.0))
    for start in range(0, T, BLOCK_T):
        o_t, m_t, b_m, _, b_r, _, _, _, b_d_r, b_d_lp, _, _, _, _ = block_terms(
            logp, old, ref, weight, entropy, adv, mask, row, start, T, b_adv_row, b_seq_lr,
            eps_low, eps_high, dual_clip, beta, kl_clip, entropy_coef, tau_pos, tau_neg,
            HAS_OLD, HAS_REF, HAS_WEIGHT, HAS_ENTROPY, HAS_DUAL, ADV_PER_TOKEN, PG, SEQ_RATIO, KL, HAS_KL_CLIP, KL_BIAS,
            BLOCK_T,
        )  # fmt: skip
        if SEQ_GRAD:
            b_d = b_seq_coef + b_d_lp
        else:
            # a clipped token (d_r = 0) stays at 0 when r overflowed: no 0·inf
            b_d = tl.where(b_d_r == 0.0, 0.0, b_d_r * b_r) + b_d_lp
        b_d = tl.where(b_m, b_g * b_d, 0.0)
        tl.store(d_logp + row + o_t, b_d.to(d_logp.dtype.element_ty), mask=m_t)
        if HAS_ENTROPY:
            b_de = tl.where(b_m, -entropy_coef * b_g, 0.0)
            tl.store(d_entropy + row + o_t, b_de.to(d_entropy.dtype.element_ty), mask=m_t)


def policy_bwd(inputs: tuple, seq_log_ratio, grad_row, params: PolicyLossParams):
    """The forward's inputs (logp, advantages, mask, old, ref, weight, entropy), its seq_log_ratio `[B]` and
    dL/d(row_loss) `[B]` → d_logp, d_entropy or None.

    The gradients are `[B, T]` in the dtype of logp and entropy.
    """
    logp, entropy = inputs[0], inputs[6]
    B, T = logp.shape
    tensors, scalars, flags = launch_args(*inputs, params)
    d_logp = torch.empty_like(logp, memory_format=torch.contiguous_format)
    d_entropy = None if entropy is None else torch.empty_like(entropy, memory_format=torch.contiguous_format)
    if B > 0:
        policy_bwd_kernel[(B,)](
            *tensors, seq_log_ratio, grad_row.float().contiguous(), d_logp, d_entropy, T, **scalars, **flags,
            num_warps=configs.POLICY_NUM_WARPS,
        )  # fmt: skip
    return d_logp, d_entropy
