"""grpo_loss from hidden states against the float64 full-logits oracle, and the nn.Module wrapper."""

import pytest
import torch
from loss_oracle import oracle_logprobs, oracle_loss

from fastrl import GRPOLoss, LossConfig, grpo_loss

IMPLS = ["torch", "triton"]


def make_inputs(B=3, T=7, D=24, V=53, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    weight = torch.randn(V, D, generator=g, dtype=torch.float64) / D**0.5
    bias = 0.1 * torch.randn(V, generator=g, dtype=torch.float64)
    targets = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 5:] = False
    mask[2, 2:] = False
    targets[0, 6] = -100  # masked positions may hold ignore_index or any valid id
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4 - 2
    ref = old + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    rollout = old + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    return dict(
        hidden=hidden, weight=weight, bias=bias, targets=targets, mask=mask, old=old, ref=ref, rollout=rollout, adv=adv
    )


CONFIGS = {
    "grpo-token-k3-ent": LossConfig(
        loss_agg="grpo", beta=0.04, entropy_coef=0.02, dual_clip=2.0, is_cap=2.0, temperature=0.7
    ),
    "drgrpo-seq-k1": LossConfig(loss_agg="dr_grpo", max_completion_length=9, beta=0.1, kl="k1", ratio_level="sequence"),
    "token-mean-k2-ent": LossConfig(loss_agg="token-mean", beta=0.1, kl="k2", entropy_coef=-0.01, is_cap=1.1),
    # TRL's vLLM default: sequence-level masked IS, bias-corrected KL
    "seq-mask-is-bias-kl": LossConfig(
        beta=0.04, kl_bias_correction=True, is_cap=3.0, is_level="sequence", is_mode="mask"
    ),
    "cispo-opsm-top-entropy": LossConfig(
        pg_loss="cispo",
        eps_low=1.0,
        eps_high=3.0,
        off_policy_mask=0.0,
        top_entropy_quantile=0.5,
        entropy_coef=0.01,
        entropy_agg="token-mean",
    ),  # fmt: skip
    "sapo-gspo-token-k3plus": LossConfig(
        loss_agg="grpo",
        pg_loss="sapo",
        ratio_level="sequence-token",
        beta=0.1,
        kl="k3+",
        kl_clip=0.05,
        count_empty_rows=False,
    ),  # fmt: skip
}


def _leaves(x, dtype):
    return [x[k].to(dtype).clone().requires_grad_(True) for k in ("hidden", "weight", "bias")]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_grpo_loss_matches_oracle(name, impl):
    cfg = CONFIGS[name]
    x = make_inputs()
    h64, w64, b64 = _leaves(x, torch.float64)
    lp, ent = oracle_logprobs(h64, w64, torch.where(x["mask"], x["targets"], 0), b64, cfg.temperature, True)
    loss64 = oracle_loss(
        lp,
        x["adv"],
        x["mask"],
        cfg,
        old=x["old"],
        ref=x["ref"],
        rollout=x["rollout"] if cfg.is_cap else None,
        entropy=ent,
    )
    grads64 = torch.autograd.grad(loss64, (h64, w64, b64))
    h, w, b = _leaves(x, torch.float32)
    f32 = {k: x[k].float() for k in ("old", "ref", "rollout", "adv")}
    out = grpo_loss(
        h,
        w,
        x["targets"],
        x["mask"],
        f32["adv"],
        bias=b,
        old_logprobs=f32["old"],
        ref_logprobs=f32["ref"],
        rollout_logprobs=f32["rollout"] if cfg.is_cap else None,
        config=cfg,
        impl=impl,
    )
    out.loss.backward()
    torch.testing.assert_close(out.loss.double(), loss64, rtol=1e-5, atol=1e-6)
    for got, want in zip((h.grad, w.grad, b.grad), grads64):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-6)
    assert ("entropy_mean" in out.metrics) == (cfg.entropy_coef != 0 or cfg.top_entropy_quantile < 1)


def test_masked_targets_may_be_any_id_but_not_ignore_where_live():
    x = make_inputs()
    h, w, _ = _leaves(x, torch.float32)
    t2 = x["targets"].clone()
    t2[~x["mask"]] = 0
    a = grpo_loss(h, w, x["targets"], x["mask"], x["adv"].float(), impl="torch").loss
    b = grpo_loss(h, w, t2, x["mask"], x["adv"].float(), impl="torch").loss
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    bad = x["targets"].clone()
    bad[1, 0] = -100
    with pytest.raises(ValueError, match="ignore_index=-100"):
        grpo_loss(h, w, bad, x["mask"], x["adv"].float(), impl="torch")
    with pytest.raises(ValueError, match="hidden must be a"):
        grpo_loss(h[0], w, x["targets"], x["mask"], x["adv"].float(), impl="torch")


def test_module_wrapper_and_tied_weight():
    x = make_inputs()
    emb = torch.nn.Embedding(53, 24)
    ids = torch.randint(0, 53, (3, 7))
    mod = GRPOLoss(loss_agg="bnpo", eps_high=0.28, impl="torch")
    assert mod.config == LossConfig(loss_agg="token-mean", eps_high=0.28)
    # hidden depends on the embedding and the head IS the embedding: both gradient paths add up
    hidden = torch.tanh(emb(ids))
    out = mod(hidden, emb.weight, x["targets"], x["mask"], x["adv"].float(), old_logprobs=x["old"].float())
    out.loss.backward()
    got = emb.weight.grad.clone()
    emb.weight.grad = None
    hidden = torch.tanh(emb(ids))
    logits = hidden @ emb.weight.T
    lp = torch.log_softmax(logits, -1).gather(-1, torch.where(x["mask"], x["targets"], 0)[..., None])[..., 0]
    from fastrl import policy_loss

    policy_loss(lp, x["adv"].float(), x["mask"], old_logprobs=x["old"].float(), config=mod.config).loss.backward()
    torch.testing.assert_close(got, emb.weight.grad, rtol=1e-5, atol=1e-7)
    with pytest.raises(TypeError, match="epsilon"):
        GRPOLoss(epsilon=0.2)
    with pytest.raises(ValueError, match="either config"):
        GRPOLoss(config=LossConfig(), beta=0.1)
