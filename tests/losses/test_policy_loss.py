"""policy_loss against the float64 per-token oracle: every mode × ratio level × KL estimator."""

import pytest
import torch
from loss_oracle import oracle_loss

from fastrl import LossConfig, policy_loss
from fastrl.losses.config import AGG_MODES

# "triton" runs the fused kernel under TRITON_INTERPRET=1 (tests/conftest.py) on CPU
IMPLS = ["torch", "triton"]


def make_batch(B=4, T=13, per_token_adv=False, spread=0.4, dtype=torch.float64, seed=0):
    """Ratios spread enough that both clips and the dual clip bind; ragged masks, one empty row."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = logp + spread * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    rollout = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    entropy = torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[1] = 0
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.randn((B, T) if per_token_adv else (B,), generator=g, dtype=torch.float64)
    to = dict(dtype=dtype)
    return dict(
        logp=logp.to(**to),
        old=old.to(**to),
        ref=ref.to(**to),
        rollout=rollout.to(**to),
        entropy=entropy.to(**to),
        mask=mask,
        adv=adv.to(**to),
    )


def full_config(mode, level, kl, **over):
    fields = dict(
        loss_agg=mode,
        eps_low=0.2,
        eps_high=0.28,
        dual_clip=1.5,
        beta=0.05,
        kl=kl,
        entropy_coef=0.01,
        ratio_level=level,
        max_completion_length=16,
        is_cap=1.2,
    )
    fields.update(over)
    return LossConfig(**fields)


def run_fastrl(b, cfg, impl, dtype, normalizer=None, on_policy=False):
    logp = b["logp"].to(dtype).clone().requires_grad_(True)
    entropy = b["entropy"].to(dtype).clone().requires_grad_(True)
    cast = {k: b[k].to(dtype) for k in ("old", "ref", "rollout")}
    out = policy_loss(
        logp,
        b["adv"].to(dtype),
        b["mask"],
        old_logprobs=None if on_policy else cast["old"],
        ref_logprobs=cast["ref"],
        rollout_logprobs=cast["rollout"] if cfg.is_cap is not None else None,
        entropy=entropy,
        config=cfg,
        normalizer=normalizer,
        impl=impl,
    )
    out.loss.backward()
    return out, logp.grad, entropy.grad


def run_oracle(b, cfg, normalizer=None, on_policy=False):
    logp = b["logp"].double().clone().requires_grad_(True)
    entropy = b["entropy"].double().clone().requires_grad_(True)
    loss = oracle_loss(
        logp,
        b["adv"].double(),
        b["mask"],
        cfg,
        old=None if on_policy else b["old"].double(),
        ref=b["ref"].double(),
        rollout=b["rollout"].double() if cfg.is_cap is not None else None,
        entropy=entropy,
        normalizer=normalizer,
    )
    g_logp, g_ent = torch.autograd.grad(loss, (logp, entropy), allow_unused=True)
    return loss, g_logp, torch.zeros_like(entropy) if g_ent is None else g_ent


def assert_matches(b, cfg, impl, **kw):
    loss64, g64, ge64 = run_oracle(b, cfg, **kw)
    # float64 through the torch path: the same math, to rounding
    if impl == "torch":
        out, g, ge = run_fastrl(b, cfg, impl, torch.float64, **kw)
        torch.testing.assert_close(out.loss, loss64, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g, g64, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ge if ge is not None else torch.zeros_like(ge64), ge64, rtol=1e-12, atol=1e-12)
    out, g, ge = run_fastrl(b, cfg, impl, torch.float32, **kw)
    assert out.loss.dtype == torch.float32 and g.dtype == torch.float32
    torch.testing.assert_close(out.loss.double(), loss64, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g.double(), g64, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        (ge if ge is not None else torch.zeros_like(ge64, dtype=torch.float32)).double(), ge64, rtol=1e-5, atol=1e-6
    )
    return out


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kl", ["k1", "k2", "k3"])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", AGG_MODES)
def test_all_features_match_oracle(mode, level, kl, impl):
    per_token = kl == "k2"  # per-token advantages on a third of the grid, [B] on the rest
    b = make_batch(per_token_adv=per_token)
    out = assert_matches(b, full_config(mode, level, kl), impl)
    m = out.metrics
    if level == "token":
        # the batch is built so that every clip binds somewhere
        assert m["clip_frac_low"] > 0 and m["clip_frac_high"] > 0 and m["clip_frac_dual"] > 0
    assert m["num_tokens"] == b["mask"].sum()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", AGG_MODES)
def test_plain_clip_on_and_off_policy(mode, level, impl):
    cfg = LossConfig(loss_agg=mode, ratio_level=level, max_completion_length=20)
    b = make_batch(per_token_adv=True, spread=0.6, seed=1)
    assert_matches(b, cfg, impl)
    assert_matches(b, cfg, impl, on_policy=True)


@pytest.mark.parametrize("impl", IMPLS)
def test_on_policy_gradient_is_minus_advantage(impl):
    b = make_batch(dtype=torch.float32)
    cfg = LossConfig(loss_agg="token-mean")
    logp = b["logp"].clone().requires_grad_(True)
    out = policy_loss(logp, b["adv"], b["mask"], config=cfg, impl=impl)
    out.loss.backward()
    n = b["mask"].sum()
    expected = -b["adv"][:, None] * b["mask"] / n
    torch.testing.assert_close(logp.grad, expected, rtol=1e-6, atol=1e-7)
    assert out.metrics["ratio_mean"] == 1 and out.metrics["clip_frac_low"] == 0


@pytest.mark.parametrize("impl", IMPLS)
def test_metrics_match_definitions(impl):
    b = make_batch(dtype=torch.float32, per_token_adv=True)
    cfg = full_config("token-mean", "token", "k3")
    out = policy_loss(
        b["logp"],
        b["adv"],
        b["mask"],
        old_logprobs=b["old"],
        ref_logprobs=b["ref"],
        rollout_logprobs=b["rollout"],
        entropy=b["entropy"],
        config=cfg,
        impl=impl,
    )
    m, a = b["mask"], b["adv"]
    r = torch.exp(b["logp"] - b["old"])
    rho = b["ref"] - b["logp"]
    expect = {
        "clip_frac_low": ((r < 0.8) & (a < 0))[m].float().mean(),
        "clip_frac_high": ((r > 1.28) & (a > 0))[m].float().mean(),
        "ratio_mean": r[m].mean(),
        "log_ratio_abs_mean": (b["logp"] - b["old"]).abs()[m].mean(),
        "kl_mean": (torch.exp(rho) - rho - 1)[m].mean(),
        "entropy_mean": b["entropy"][m].mean(),
        "is_weight_mean": torch.exp(b["old"] - b["rollout"]).clamp(max=1.2)[m].mean(),
        "num_tokens": m.sum().float(),
    }
    for key, value in expect.items():
        torch.testing.assert_close(m_val := out.metrics[key], value, rtol=1e-5, atol=1e-6, msg=key)
        assert not m_val.requires_grad
    assert 0 < out.metrics["clip_frac_dual"] < 1


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_triton_rows_longer_than_one_block(level, monkeypatch):
    # the kernel loops over a row in BLOCK_T pieces: force 3 of them, the last one ragged
    from fastrl.kernels import configs

    monkeypatch.setattr(configs, "POLICY_MAX_BLOCK_T", 16)
    b = make_batch(B=3, T=37, per_token_adv=level == "token", seed=7)
    assert_matches(b, full_config("seq-mean-token-mean", level, "k3"), "triton")


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_bf16_inputs_compute_in_float32_on_both_paths(level):
    b = make_batch(dtype=torch.bfloat16, per_token_adv=True, seed=11)
    cfg = full_config("token-mean", level, "k3")
    results = {impl: run_fastrl(b, cfg, impl, torch.bfloat16) for impl in IMPLS}
    (out_t, g_t, ge_t), (out_k, g_k, ge_k) = results["torch"], results["triton"]
    assert out_t.loss.dtype == out_k.loss.dtype == torch.float32
    assert g_t.dtype == g_k.dtype == torch.bfloat16
    torch.testing.assert_close(out_k.loss, out_t.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_k, g_t)
    torch.testing.assert_close(ge_k, ge_t)
    # and both agree with the float64 oracle on the bf16-rounded inputs
    loss64, _, _ = run_oracle({k: v.double() if v.is_floating_point() else v for k, v in b.items()}, cfg)
    torch.testing.assert_close(out_t.loss.double(), loss64, rtol=1e-5, atol=1e-6)
