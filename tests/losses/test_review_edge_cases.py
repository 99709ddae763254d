"""Review regressions for `policy_loss` / `grpo_loss` / `LossConfig`: each test names the bug it pins.

Both implementations run (Triton under the interpreter); the ground truth is float64.
"""

import numpy as np
import pytest
import torch

from fastrl import GRPOLoss, LossConfig, grpo_loss, policy_loss

IMPLS = ["torch", "triton"]


def _leaf(t):
    return t.detach().clone().requires_grad_(True)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_clipped_tokens_with_overflowed_ratio_have_zero_gradient(impl, level):
    # Bug: r = exp(logp − old) = inf on a token whose clip binds gave the right (finite) loss but a NaN
    # gradient, 0·inf through d r / d logp, on both paths. Masked positions carry GSPO's row ratio too.
    logp = _leaf(torch.zeros(3, 5))
    old = torch.full((3, 5), -100.0)  # r = e^100 overflows fp32
    mask = torch.ones(3, 5)
    mask[1, 3:] = 0
    adv = torch.tensor([1.0, 2.0, 0.5])  # A > 0: the upper clip binds everywhere
    cfg = LossConfig(eps_high=0.28, ratio_level=level, loss_agg="seq-mean-token-mean")
    out = policy_loss(logp, adv, mask, old_logprobs=old, config=cfg, impl=impl)
    out.loss.backward()
    assert float(out.loss) == pytest.approx(-1.28 * float(adv.mean()), rel=1e-6)
    assert torch.equal(logp.grad, torch.zeros_like(logp))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_dual_clip_bounds_loss_and_gradient_of_an_overflowed_ratio(impl, level):
    # Dual clip exists for exactly this case (A < 0, r huge): the loss is −c·A and the gradient 0, not NaN.
    logp = _leaf(torch.zeros(2, 4))
    old = torch.full((2, 4), -100.0)
    adv = torch.tensor([-1.0, -0.5])
    cfg = LossConfig(dual_clip=3.0, ratio_level=level)
    out = policy_loss(logp, adv, torch.ones(2, 4), old_logprobs=old, config=cfg, impl=impl)
    out.loss.backward()
    assert float(out.loss) == pytest.approx(3.0 * 0.75, rel=1e-6)
    assert torch.equal(logp.grad, torch.zeros_like(logp))
    assert float(out.metrics["clip_frac_dual"]) == 1.0


@pytest.mark.parametrize("impl", IMPLS)
def test_dual_clip_never_applies_to_positive_advantages(impl):
    logp = _leaf(torch.zeros(2, 3))
    old = torch.full((2, 3), -0.05)  # r ≈ 1.05, inside the clip range: −r·A, any c
    adv = torch.tensor([4.0, 1.0])
    outs = [
        policy_loss(logp, adv, torch.ones(2, 3), old_logprobs=old, config=LossConfig(dual_clip=c), impl=impl)
        for c in (None, 1.01)
    ]
    assert float(outs[0].loss) == float(outs[1].loss)
    assert float(outs[1].metrics["clip_frac_dual"]) == 0.0


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("scale", [1e-4, 1e-2, 0.3, 2.0])
def test_k3_kl_is_accurate_for_small_log_ratios(impl, scale):
    # Bug: the kernel computed exp(ρ) − 1 − ρ directly in fp32: at |ρ| ~ 1e-4 (a policy still next to its
    # reference) kl_mean came out 3.5× too large, and torch and triton disagreed.
    torch.manual_seed(3)
    logp = torch.randn(4, 32) * 0.5 - 2
    ref = logp + scale * torch.randn(4, 32)
    mask = torch.rand(4, 32) > 0.2
    lp = _leaf(logp)
    # A = 0: the loss is β·KL alone, so its gradient checks the KL derivative too
    out = policy_loss(lp, torch.zeros(4), mask, ref_logprobs=ref, config=LossConfig(beta=0.5), impl=impl)
    out.loss.backward()
    lp64 = _leaf(logp.double())
    rho = ref.double() - lp64
    kl = torch.expm1(rho) - rho
    want = kl[mask].mean()
    want_grad = torch.autograd.grad(0.5 * want, lp64)[0]
    assert float(out.metrics["kl_mean"]) == pytest.approx(float(want), rel=1e-4)
    assert float(out.loss) == pytest.approx(0.5 * float(want), rel=1e-4)
    torch.testing.assert_close(lp.grad.double(), want_grad, rtol=1e-4, atol=1e-7 * scale)


@pytest.mark.parametrize("bad", [torch.tensor(-3.0), torch.tensor(float("nan")), torch.tensor([float("inf")])])
def test_bad_tensor_normalizer_raises(bad):
    # Bug: a negative or NaN normalizer tensor was silently replaced by 1 (a wrong loss scale).
    with pytest.raises(ValueError, match="normalizer"):
        policy_loss(torch.zeros(2, 3), torch.ones(2), torch.ones(2, 3), normalizer=bad, impl="torch")


def test_numpy_scalars_are_accepted_where_numbers_are():
    cfg = LossConfig(eps_high=np.float32(0.28), loss_agg="dr_grpo", max_completion_length=np.int64(16))
    assert cfg.max_completion_length == 16 and type(cfg.max_completion_length) is int
    logp, mask = torch.randn(2, 3), torch.ones(2, 3)
    got = policy_loss(logp, torch.ones(2), mask, config=cfg, normalizer=np.int64(4), impl="torch").loss
    want = policy_loss(logp, torch.ones(2), mask, config=cfg, normalizer=4, impl="torch").loss
    assert float(got) == float(want)


@pytest.mark.parametrize("impl", IMPLS)
def test_grpo_loss_torch_and_triton_agree_with_float64(impl):
    # The shifted-slice call with int32 targets, garbage ids under the mask, bias, temperature,
    # entropy bonus, KL and dual clip: loss and every gradient against a float64 eager pipeline.
    torch.manual_seed(5)
    B, T, D, V = 3, 7, 16, 29
    full, weight, bias = torch.randn(B, T + 1, D), torch.randn(V, D) * 0.3, torch.randn(V) * 0.1
    targets = torch.randint(0, V, (B, T))
    mask = torch.rand(B, T) > 0.3
    mask[:, 0] = True
    garbage = torch.where(mask, targets, torch.full_like(targets, 10**6)).int()
    adv = torch.randn(B).bfloat16()
    cfg = LossConfig(loss_agg="grpo", beta=0.05, entropy_coef=0.01, temperature=0.7, dual_clip=3.0)
    z = (full[:, :-1].double() @ weight.double().T + bias.double()) / 0.7
    base = z.log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1).float()
    old = base + 0.1 * torch.randn(B, T)
    ref = base + 0.1 * torch.randn(B, T)

    leaves = [_leaf(t) for t in (full, weight, bias)]
    out = grpo_loss(
        leaves[0][:, :-1], leaves[1], garbage, mask, adv, bias=leaves[2], old_logprobs=old, ref_logprobs=ref,
        config=cfg, impl=impl,
    )  # fmt: skip
    out.loss.backward()

    ref_leaves = [_leaf(t.double()) for t in (full, weight, bias)]
    z64 = (ref_leaves[0][:, :-1] @ ref_leaves[1].T + ref_leaves[2]) / 0.7
    ls = z64.log_softmax(-1)
    lp64, ent64 = ls.gather(-1, targets[..., None]).squeeze(-1), -(ls.exp() * ls).sum(-1)
    want = policy_loss(
        lp64, adv.double(), mask, old_logprobs=old.double(), ref_logprobs=ref.double(), entropy=ent64,
        config=cfg, impl="torch",
    )  # fmt: skip
    want.loss.backward()
    assert float(out.loss) == pytest.approx(float(want.loss), rel=1e-5, abs=1e-6)
    for got, exp in zip(leaves, ref_leaves):
        torch.testing.assert_close(got.grad.double(), exp.grad, rtol=1e-4, atol=1e-6)
    for name, value in out.metrics.items():
        assert not value.requires_grad and torch.isfinite(value), name


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_rows_longer_than_one_kernel_block(level):
    # T > MAX_BLOCK_T (1024): the kernel walks each row in several blocks (GSPO's mean first); the
    # other tests stay under one block. Non-contiguous mask, every option on.
    torch.manual_seed(7)
    B, T = 2, 1100
    logp = torch.randn(B, T) * 0.3 - 1
    old, ref = logp + 0.3 * torch.randn(B, T), logp + 0.2 * torch.randn(B, T)
    rollout, entropy = old + 0.1 * torch.randn(B, T), torch.rand(B, T)
    mask = (torch.rand(T, B) > 0.2).t()
    cfg = LossConfig(loss_agg="grpo", ratio_level=level, beta=0.1, dual_clip=3.0, is_cap=2.0, entropy_coef=0.01)
    results = []
    for impl in IMPLS:
        lp, ent = _leaf(logp), _leaf(entropy)
        out = policy_loss(
            lp, torch.tensor([-0.7, 1.3]), mask, old_logprobs=old, ref_logprobs=ref, rollout_logprobs=rollout,
            entropy=ent, config=cfg, impl=impl,
        )  # fmt: skip
        out.loss.backward()
        results.append((out, lp.grad, ent.grad))
    (a, ga, ea), (b, gb, eb) = results
    torch.testing.assert_close(a.loss, b.loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(ea, eb)
    for name in a.metrics:
        torch.testing.assert_close(a.metrics[name], b.metrics[name], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("impl", IMPLS)
def test_grpo_loss_uint8_targets(impl):
    # Bug: in uint8, token 156 == -100 after wrap-around: grpo_loss raised "targets hold ignore_index"
    # for a real token, and its masking wrote 156 (a real id) where it meant -100.
    hidden, weight = torch.randn(2, 4, 8), torch.randn(200, 8)
    targets = torch.randint(0, 200, (2, 4))
    targets[0, 0] = 156
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    targets[1, 3] = 156  # under the mask
    grads = []
    for t in (targets.to(torch.uint8), targets):
        h = _leaf(hidden)
        grpo_loss(h, weight, t, mask, torch.ones(2), impl=impl).loss.backward()
        grads.append(h.grad)
    torch.testing.assert_close(grads[0], grads[1])
    assert bool((grads[0][mask == 0] == 0).all())


def test_grpo_module_rejects_unknown_impl_at_construction():
    with pytest.raises(ValueError, match="'cuda'"):
        GRPOLoss(loss_agg="grpo", impl="cuda")
