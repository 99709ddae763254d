"""Fused per-token policy loss, forward (docs/math.md §2): one program per sequence.

Each program walks its row in `[BLOCK_T]` blocks, computes ratio, policy term (clip / SAPO gate /
linear), dual clip, weight, KL and entropy terms in float32 and reduces them to the row's masked sums:
the loss Σ_t m·ℓ and the `STATS` columns, each stored at the index its `STAT_*` constexpr gives. The
aggregation over rows (docs/math.md §3) is a handful of `[B]` ops outside. A sequence-level ratio needs
the row's masked mean log ratio first: the forward stores it per row for the backward.
"""

import torch
import triton
import triton.language as tl

from .. import configs
from .params import NUM_STATS, STAT_CONSTEXPRS, PolicyLossParams
from .terms import OPTIONAL_INPUTS, block_terms, launch_args, row_log_ratio

__all__ = ["policy_fwd", "policy_fwd_kernel"]


@triton.heuristics(OPTIONAL_INPUTS)
@triton.jit
def policy_fwd_kernel(logp, old, ref, weight, entropy, adv, mask, row_loss, stats, seq_log_ratio, T,
                      eps_low, eps_high, dual_clip, beta, kl_clip, entropy_coef, tau_pos, tau_neg,
                      HAS_OLD: tl.constexpr, HAS_REF: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                      HAS_ENTROPY: tl.constexpr, HAS_DUAL: tl.constexpr, ADV_PER_TOKEN: tl.constexpr,
                      PG: tl.constexpr, SEQ_RATIO: tl.constexpr, SEQ_GRAD: tl.constexpr, KL: tl.constexpr,
                      HAS_KL_CLIP: tl.constexpr, KL_BIAS: tl.constexpr, NUM_STATS: tl.constexpr,
                      STAT_TOKENS: tl.constexpr, STAT_CLIP_LOW: tl.constexpr, STAT_CLIP_HIGH: tl.constexpr,
                      STAT_CLIP_DUAL: tl.constexpr, STAT_RATIO: tl.constexpr, STAT_LOG_RATIO_ABS: tl.constexpr,
                      STAT_KL: tl.constexpr, STAT_ENTROPY: tl.constexpr, STAT_IS_WEIGHT: tl.constexpr,
                      BLOCK_T: tl.constexpr):  # fmt: skip
    i_b = tl.program_id(0).to(tl.int64)
    row = i_b * T
    b_adv_row = 0.0
    if not ADV_PER_TOKEN:
        b_adv_row = tl.load(adv + i_b).to(tl.float32)
    b_seq_lr = 0.0
    if SEQ_RATIO:
        b_seq_lr = row_log_ratio(logp, old, mask, row, T, HAS_OLD, BLOCK_T)
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
        _, _, b_m, b_lr, b_r, b_w, b_h, b_loss, _, _, b_low, b_high, b_dual, b_kl = block_terms(
            logp, old, ref, weight, entropy, adv, mask, row, start, T, b_adv_row, b_seq_lr,
            eps_low, eps_high, dual_clip, beta, kl_clip, entropy_coef, tau_pos, tau_neg,
            HAS_OLD, HAS_REF, HAS_WEIGHT, HAS_ENTROPY, HAS_DUAL, ADV_PER_TOKEN, PG, SEQ_RATIO, KL, HAS_KL_CLIP, KL_BIAS,
            BLOCK_T,
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
        b_acc_w += b_w
    tl.store(row_loss + i_b, tl.sum(b_acc_loss, axis=0))
    p_s = stats + i_b * NUM_STATS
    tl.store(p_s + STAT_TOKENS, tl.sum(b_acc_tok, axis=0))
    tl.store(p_s + STAT_CLIP_LOW, tl.sum(b_acc_low, axis=0))
    tl.store(p_s + STAT_CLIP_HIGH, tl.sum(b_acc_high, axis=0))
    tl.store(p_s + STAT_CLIP_DUAL, tl.sum(b_acc_dual, axis=0))
    tl.store(p_s + STAT_RATIO, tl.sum(b_acc_r, axis=0))
    tl.store(p_s + STAT_LOG_RATIO_ABS, tl.sum(b_acc_alr, axis=0))
    tl.store(p_s + STAT_KL, tl.sum(b_acc_kl, axis=0))
    tl.store(p_s + STAT_ENTROPY, tl.sum(b_acc_h, axis=0))
    tl.store(p_s + STAT_IS_WEIGHT, tl.sum(b_acc_w, axis=0))


def policy_fwd(logp, advantages, mask, old, ref, weight, entropy, params: PolicyLossParams):
    """`[B, T]` inputs (advantages `[B]` or `[B, T]`) → row_loss `[B]`, stats `[B, NUM_STATS]`, seq_log_ratio `[B]`.

    All float32; the outputs start as NaN, so an element the kernel does not write shows.
    """
    B, T = logp.shape
    tensors, scalars, flags = launch_args(logp, advantages, mask, old, ref, weight, entropy, params)
    dev = logp.device
    row_loss = torch.full((B,), float("nan"), dtype=torch.float32, device=dev)
    stats = torch.full((B, NUM_STATS), float("nan"), dtype=torch.float32, device=dev)
    seq_log_ratio = torch.zeros(B, dtype=torch.float32, device=dev)
    if B > 0:
        policy_fwd_kernel[(B,)](
            *tensors,
            row_loss,
            stats,
            seq_log_ratio,
            T,
            **scalars,
            **flags,
            NUM_STATS=NUM_STATS,
            **STAT_CONSTEXPRS,
            num_warps=configs.POLICY_NUM_WARPS,
        )
    return row_loss, stats, seq_log_ratio
