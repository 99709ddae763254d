"""Each term added for the peers' options against the float64 oracle, on both implementations: the loss
and the gradients w.r.t. logprobs and entropy (docs/math.md §2–3)."""

import pytest
import torch
from loss_oracle import oracle_loss

from fastrl import LossConfig, policy_loss
from fastrl.losses import Normalizer

IMPLS = ["torch", "triton"]


def make_batch(B=6, T=11, spread=1.5, ref_spread=3.0, per_token_adv=False, seed=0):
    """Ratios up to e^±spread, reference log ratios up to ±ref_spread, a ragged mask with one empty row."""
    g = torch.Generator().manual_seed(seed)

    def u(*shape):
        return 2 * torch.rand(*shape, generator=g, dtype=torch.float64) - 1

    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[1] = 0
    return dict(
        logp=logp,
        old=logp + spread * u(B, T),
        ref=logp + ref_spread * u(B, T),
        rollout=logp + spread * u(B, T),
        entropy=torch.rand(B, T, generator=g, dtype=torch.float64) * 2,
        mask=torch.arange(T)[None, :] < lengths[:, None],
        adv=u(B, T) if per_token_adv else u(B),
    )


def uses_rollout(cfg):
    return cfg.is_cap is not None or cfg.off_policy_mask is not None


def run_fastrl(b, cfg, impl, dtype, normalizer):
    logp = b["logp"].to(dtype).clone().requires_grad_(True)
    entropy = b["entropy"].to(dtype).clone().requires_grad_(True)
    out = policy_loss(
        logp,
        b["adv"].to(dtype),
        b["mask"],
        old_logprobs=b["old"].to(dtype),
        ref_logprobs=b["ref"].to(dtype),
        rollout_logprobs=b["rollout"].to(dtype) if uses_rollout(cfg) else None,
        entropy=entropy,
        config=cfg,
        normalizer=normalizer,
        impl=impl,
    )
    grads = torch.autograd.grad(out.loss, (logp, entropy), allow_unused=True)
    return out, [torch.zeros_like(logp) if x is None else x for x in grads]


def run_oracle(b, cfg, normalizer):
    logp = b["logp"].clone().requires_grad_(True)
    entropy = b["entropy"].clone().requires_grad_(True)
    norm, steps = (normalizer.policy, normalizer.accumulation_steps) if normalizer else (None, 1)
    loss = oracle_loss(
        logp, b["adv"], b["mask"], cfg, old=b["old"], ref=b["ref"], rollout=b["rollout"] if uses_rollout(cfg) else None,
        entropy=entropy, normalizer=norm, accumulation_steps=steps,
    )  # fmt: skip
    grads = torch.autograd.grad(loss, (logp, entropy), allow_unused=True)
    return loss, [torch.zeros_like(logp) if x is None else x for x in grads]


def assert_matches(b, cfg, impl, normalizer=None):
    loss64, grads64 = run_oracle(b, cfg, normalizer)
    if impl == "torch":  # float64 through the torch path: the same math, to rounding
        out, grads = run_fastrl(b, cfg, impl, torch.float64, normalizer)
        torch.testing.assert_close(out.loss, loss64, rtol=1e-12, atol=1e-12)
        for g, g64 in zip(grads, grads64):
            torch.testing.assert_close(g, g64, rtol=1e-12, atol=1e-12)
    out, grads = run_fastrl(b, cfg, impl, torch.float32, normalizer)
    torch.testing.assert_close(out.loss.double(), loss64, rtol=1e-5, atol=1e-6)
    for g, g64 in zip(grads, grads64):
        torch.testing.assert_close(g.double(), g64, rtol=1e-5, atol=1e-6)
    return out, loss64


BASE = dict(loss_agg="seq-mean-token-mean", eps_low=0.2, eps_high=0.28, beta=0.05)
TERMS = {
    "cispo-token": dict(pg_loss="cispo", eps_low=0.5, eps_high=1.0),
    "cispo-sequence": dict(pg_loss="cispo", eps_low=1.0, eps_high=0.5, ratio_level="sequence"),
    "sapo-token": dict(pg_loss="sapo", sapo_tau_pos=1.0, sapo_tau_neg=1.05),
    "sapo-sequence": dict(pg_loss="sapo", ratio_level="sequence", sapo_tau_pos=2.0, sapo_tau_neg=0.5),
    "sapo-sequence-token": dict(pg_loss="sapo", ratio_level="sequence-token"),
    "gpg": dict(pg_loss="gpg"),
    "vespo": dict(pg_loss="vespo"),
    "vespo-is": dict(pg_loss="vespo", is_cap=2.0, is_mode="mask", is_min=0.3),
    "kl-abs": dict(kl="abs"),
    "kl-k1+": dict(kl="k1+"),
    "kl-k3+-clip": dict(kl="k3+", kl_clip=5.0),
    "kl-k3-clip": dict(kl="k3", kl_clip=5.0),
    "kl-k1-clip": dict(kl="k1", kl_clip=1.0),
    "kl-bias-token": dict(kl_bias_correction=True),
    "kl-bias-sequence": dict(kl_bias_correction=True, ratio_level="sequence"),
    "kl-bias-sequence-token": dict(kl_bias_correction=True, ratio_level="sequence-token", dual_clip=2.0),
    "gspo-token": dict(ratio_level="sequence-token", dual_clip=2.0),
    "is-token-truncate-min": dict(is_cap=2.0, is_min=0.5),
    "is-token-mask": dict(is_cap=2.0, is_mode="mask", is_min=0.4),
    "is-sequence-truncate": dict(is_cap=3.0, is_level="sequence", is_log_clip=2.0),
    "is-sequence-mask": dict(is_cap=3.0, is_level="sequence", is_mode="mask"),
    "off-policy-mask": dict(off_policy_mask=-0.3),
    "off-policy-mask-is": dict(off_policy_mask=0.1, is_cap=2.0, pg_loss="cispo"),
    "top-entropy": dict(top_entropy_quantile=0.4, entropy_coef=0.02),
    "top-entropy-token-mean": dict(top_entropy_quantile=0.4, entropy_coef=0.02, entropy_agg="token-mean"),
    "entropy-token-mean": dict(entropy_coef=0.03, entropy_agg="token-mean", loss_agg="seq-mean-token-sum"),
    "nonempty-rows": dict(count_empty_rows=False, entropy_coef=0.01),
    "nonempty-rows-sum": dict(count_empty_rows=False, loss_agg="seq-mean-token-sum"),
    "token-sum": dict(loss_agg="token-sum", dual_clip=3.0),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("term", list(TERMS))
def test_term_matches_oracle(term, per_token_adv, impl):
    cfg = LossConfig(**(BASE | TERMS[term]))
    b = make_batch(per_token_adv=per_token_adv, seed=len(term))
    assert_matches(b, cfg, impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_entropy_token_mean_takes_the_accumulation_steps(impl):
    cfg = LossConfig(**(BASE | TERMS["top-entropy-token-mean"]))
    assert_matches(make_batch(seed=3), cfg, impl, normalizer=Normalizer(7.0, accumulation_steps=3))


@pytest.mark.parametrize(
    "term, metric",
    [("cispo-token", "clip_frac_high"), ("vespo", "vespo_phi_mean"), ("is-token-mask", "is_weight_mean"),
     ("off-policy-mask", "off_policy_masked_frac")],
)  # fmt: skip
def test_weight_metrics(term, metric):
    cfg = LossConfig(**(BASE | TERMS[term]))
    out, _ = assert_matches(make_batch(seed=5), cfg, "torch")
    assert 0 < out.metrics[metric] and not out.metrics[metric].requires_grad


@pytest.mark.parametrize("term", ["kl-k3-clip", "kl-bias-token", "off-policy-mask", "top-entropy", "nonempty-rows",
                                  "is-sequence-mask", "gspo-token", "sapo-sequence"])  # fmt: skip
def test_each_term_changes_the_loss(term):
    """The batch makes every term bind: switching it off changes the loss or its gradient."""
    b = make_batch(per_token_adv=True, seed=len(term))
    on = run_oracle(b, LossConfig(**(BASE | TERMS[term])), None)
    plain = {k: v for k, v in TERMS[term].items() if k not in ("sapo_tau_pos", "sapo_tau_neg")}
    off = dict(plain)
    for key in plain:
        off[key] = LossConfig.__dataclass_fields__[key].default
    off_run = run_oracle(b, LossConfig(**(BASE | off)), None)
    assert abs(float(on[0] - off_run[0])) > 1e-4 or float((on[1][0] - off_run[1][0]).abs().max()) > 1e-4
