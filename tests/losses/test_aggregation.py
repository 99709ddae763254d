"""Exact normalizers: micro-batches with the global normalizer sum to the whole batch; TRL's loss types."""

import pytest
import torch
from test_policy_loss import IMPLS, full_config, make_batch

from fastrl import LossConfig, policy_loss
from fastrl.losses.config import AGG_MODES


def _loss_and_grad(b, rows, cfg, impl, normalizer):
    logp = b["logp"][rows].clone().requires_grad_(True)
    entropy = b["entropy"][rows].clone().requires_grad_(True)
    out = policy_loss(
        logp,
        b["adv"][rows],
        b["mask"][rows],
        old_logprobs=b["old"][rows],
        ref_logprobs=b["ref"][rows],
        rollout_logprobs=b["rollout"][rows],
        entropy=entropy,
        config=cfg,
        normalizer=normalizer,
        impl=impl,
    )
    out.loss.backward()
    return out.loss, logp.grad, entropy.grad


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batches_with_global_normalizer_equal_whole_batch(mode, level, impl):
    b = make_batch(B=8, T=11, per_token_adv=True, dtype=torch.float32, seed=3)
    b["adv"] = b["adv"] + 0.5  # keep the loss away from 0 so a relative tolerance means something
    cfg = full_config(mode, level, "k3")
    whole, g_whole, ge_whole = _loss_and_grad(b, slice(0, 8), cfg, impl, None)
    glob = {"token-mean": b["mask"].sum().item(), "token-sum": 1}.get(mode, 8)
    parts = [slice(0, 3), slice(3, 4), slice(4, 8)]
    losses, grads, egrads = zip(*(_loss_and_grad(b, p, cfg, impl, glob) for p in parts))
    total = sum(losses)
    torch.testing.assert_close(total, whole, rtol=1e-6, atol=0)
    torch.testing.assert_close(torch.cat(grads), g_whole, rtol=1e-6, atol=0)
    torch.testing.assert_close(torch.cat(egrads), ge_whole, rtol=1e-6, atol=0)


def test_normalizer_scales_default_loss():
    b = make_batch(dtype=torch.float32)
    cfg = LossConfig(loss_agg="seq-mean-token-sum")
    base = policy_loss(b["logp"], b["adv"], b["mask"], old_logprobs=b["old"], config=cfg).loss
    for norm in (2, 2.0, torch.tensor(2), torch.tensor([2.0])):
        scaled = policy_loss(b["logp"], b["adv"], b["mask"], old_logprobs=b["old"], config=cfg, normalizer=norm)
        torch.testing.assert_close(scaled.loss, base * 4 / 2)


def _trl_per_token(logp, old, ref, adv, mask, epsilon, epsilon_high, beta, level):
    # TRL's documented GRPO objective, written from its docs: ratio → two-sided clip → −min(...) + β·k3
    log_ratio = logp - old
    if level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)).unsqueeze(-1)
    coef_1 = torch.exp(log_ratio)
    coef_2 = torch.clamp(coef_1, 1 - epsilon, 1 + epsilon_high)
    a = adv.unsqueeze(-1)
    per_token = -torch.min(coef_1 * a, coef_2 * a)
    if beta:
        per_token = per_token + beta * (torch.exp(ref - logp) - (ref - logp) - 1)
    return per_token


def _trl_loss(loss_type, per_token, mask, max_completion_length, num_items_in_batch):
    if loss_type == "grpo":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if loss_type == "bnpo":
        return (per_token * mask).sum() / mask.sum().clamp(min=1)
    if loss_type == "dr_grpo":
        return (per_token * mask).sum() / (per_token.size(0) * max_completion_length)
    return (per_token * mask).sum() / num_items_in_batch  # dapo: the step's token count over all processes


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_trl_loss_types(loss_type, level, impl):
    b = make_batch(B=6, T=9, dtype=torch.float64, seed=5)
    mask = b["mask"].double()
    num_items = mask.sum() + 17  # as if other micro-batches of the step held 17 more tokens
    epsilon, epsilon_high, beta, max_len = 0.2, 0.28, 0.04, 12
    logp_trl = b["logp"].clone().requires_grad_(True)
    per_token = _trl_per_token(logp_trl, b["old"], b["ref"], b["adv"], mask, epsilon, epsilon_high, beta, level)
    expected = _trl_loss(loss_type, per_token, mask, max_len, num_items)
    expected.backward()
    cfg = LossConfig(
        loss_agg=loss_type,
        eps_low=epsilon,
        eps_high=epsilon_high,
        beta=beta,
        ratio_level=level,
        max_completion_length=max_len,
    )
    dtype = torch.float64 if impl == "torch" else torch.float32
    logp = b["logp"].to(dtype).requires_grad_(True)
    out = policy_loss(
        logp,
        b["adv"].to(dtype),
        b["mask"],
        old_logprobs=b["old"].to(dtype),
        ref_logprobs=b["ref"].to(dtype),
        config=cfg,
        normalizer=num_items.item() if loss_type == "dapo" else None,
        impl=impl,
    )
    out.loss.backward()
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(out.loss.double(), expected.detach(), rtol=tol, atol=tol)
    torch.testing.assert_close(logp.grad.double(), logp_trl.grad, rtol=tol, atol=tol)
