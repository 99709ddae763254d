"""Seeded fuzz of the numerics edge cases: padding that holds NaN/inf, ratio overflow at zero advantage,
a −inf bias, strided inputs, tiny temperatures, an empty vocabulary and double backward.

Each case checks two things on both implementations (Triton under the interpreter): a valid input gives
no NaN, and the answer is the right one (the same input with finite padding, or a float64 ground truth),
never a silently different one. Bad inputs raise an error naming the value.
"""

import os

import pytest
import torch

import fastrl
from fastrl.kernels import LogprobParams, token_logprobs_reference

IMPLS = ["torch", "triton"]
# cases per implementation and category (the Triton interpreter is slow); FASTRL_FUZZ_CASES=250 for a long run
CASES = int(os.environ.get("FASTRL_FUZZ_CASES", "12"))


def _shape(gen):
    b = int(torch.randint(1, 4, (1,), generator=gen))
    t = int(torch.randint(1, 9, (1,), generator=gen))
    d = int(torch.randint(1, 24, (1,), generator=gen))
    v = int(torch.randint(2, 40, (1,), generator=gen))
    return b, t, d, v


def _grads(loss, tensors):
    return torch.autograd.grad(loss, tensors, allow_unused=True)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("seed", range(CASES))
def test_nonfinite_padding_changes_nothing(impl, seed):
    # Everything at a mask-0 position may hold NaN or inf (docs/math.md §5): the loss, d_hidden, d_weight
    # and d_bias must equal those of the same batch with zeros there. The Triton d_weight GEMM once ran
    # over those rows: 0·NaN made the whole d_weight NaN.
    gen = torch.Generator().manual_seed(seed)
    B, T, D, V = _shape(gen)
    hidden = torch.randn(B, T, D, generator=gen)
    weight = torch.randn(V, D, generator=gen) * 0.5
    bias = torch.randn(V, generator=gen)
    targets = torch.randint(0, V, (B, T), generator=gen)
    mask = torch.rand(B, T, generator=gen) < 0.6
    mask[0, 0] = True
    adv = torch.randn(B, generator=gen)
    old = torch.randn(B, T, generator=gen) * 0.1 - 2.0
    ref = torch.randn(B, T, generator=gen) * 0.1 - 2.0
    config = fastrl.LossConfig(beta=0.04, entropy_coef=0.01, dual_clip=3.0)
    junk = torch.tensor([float("nan"), float("inf"), -float("inf")])
    pick = torch.randint(0, 3, (B, T), generator=gen)

    def run(fill):
        pad = ~mask
        h = torch.where(pad.unsqueeze(-1), fill[pick].unsqueeze(-1).expand(B, T, D), hidden)
        o = torch.where(pad, fill[pick], old)
        r = torch.where(pad, fill[pick], ref)
        y = torch.where(pad, torch.full_like(targets, 10**6), targets)  # not even a valid id
        h, w, b = h.requires_grad_(), weight.clone().requires_grad_(), bias.clone().requires_grad_()
        out = fastrl.grpo_loss(h, w, y, mask, adv, bias=b, old_logprobs=o, ref_logprobs=r, config=config, impl=impl)
        return (out.loss, *_grads(out.loss, (h, w, b)))

    dirty = run(junk)
    clean = run(torch.zeros(3))
    for got, want in zip(dirty, clean):
        assert bool(torch.isfinite(got).all())
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("seed", range(CASES))
def test_ratio_overflow_with_zero_advantage(impl, seed):
    # A token with A = 0 adds nothing to the policy-gradient term, whatever its ratio: with log-ratio
    # >= 89 the torch path once gave exp(89)·0 = inf·0 = NaN.
    gen = torch.Generator().manual_seed(seed)
    B, T = int(torch.randint(1, 5, (1,), generator=gen)), int(torch.randint(1, 9, (1,), generator=gen))
    logp = -torch.rand(B, T, generator=gen)
    old = logp - 0.1 * torch.randn(B, T, generator=gen)
    adv = torch.randn(B, T, generator=gen)
    zero = torch.rand(B, T, generator=gen) < 0.5
    adv = torch.where(zero, 0.0, adv)
    big = torch.where(zero, logp - 89.0 - 200.0 * torch.rand(B, T, generator=gen), old)  # log ratio >= 89
    mask = torch.ones(B, T)
    lp = logp.clone().requires_grad_()
    out = fastrl.policy_loss(lp, adv, mask, old_logprobs=big, impl=impl)
    (g,) = torch.autograd.grad(out.loss, lp)
    # the same batch with those tokens' log ratio at 0: their A = 0 makes them count for nothing either way
    lp2 = logp.clone().requires_grad_()
    want = fastrl.policy_loss(lp2, adv, mask, old_logprobs=torch.where(zero, logp, old), impl=impl)
    (g2,) = torch.autograd.grad(want.loss, lp2)
    assert bool(torch.isfinite(out.loss)) and bool(torch.isfinite(g).all())
    torch.testing.assert_close(out.loss, want.loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(g, g2, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("seed", range(CASES))
def test_neg_inf_bias(impl, seed):
    # A −inf bias bans tokens (p = 0 exactly). Entropy and every gradient stay finite and match a float64
    # ground truth; p·log p at a banned token is 0, not 0·(−inf) = NaN.
    gen = torch.Generator().manual_seed(seed)
    _, _, D, V = _shape(gen)
    V = max(V, 3)
    N = int(torch.randint(1, 30, (1,), generator=gen))
    hidden = torch.randn(N, D, generator=gen)
    weight = torch.randn(V, D, generator=gen)
    bias = torch.randn(V, generator=gen)
    banned = torch.rand(V, generator=gen) < 0.3
    banned[0] = False
    bias[banned] = -float("inf")
    allowed = (~banned).nonzero().squeeze(-1)
    targets = allowed[torch.randint(0, allowed.numel(), (N,), generator=gen)]
    targets[: N // 4] = -100
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp, ent = fastrl.token_logprobs(h, w, targets, bias=bias, return_entropy=True, impl=impl)
    g_lp = torch.autograd.grad(logp.sum(), (h, w), retain_graph=True)
    g_all = torch.autograd.grad(logp.sum() + 0.3 * ent.sum(), (h, w))
    h64, w64 = hidden.double().requires_grad_(), weight.double().requires_grad_()
    want_lp, want_ent = token_logprobs_reference(h64, w64, targets, bias.double(), LogprobParams(1.0, -100, True))
    want_g_lp = torch.autograd.grad(want_lp.sum(), (h64, w64), retain_graph=True)
    # the float64 reference's own entropy at a banned column is 0·(−inf): take the truth from the
    # allowed columns only, where it is well defined
    sub = token_logprobs_reference(
        h64, w64[allowed], _remap(targets, allowed), bias.double()[allowed], LogprobParams(1.0, -100, True)
    )
    want_ent = sub[1]
    want_g_all = torch.autograd.grad(sub[0].sum() + 0.3 * sub[1].sum(), (h64, w64))
    torch.testing.assert_close(logp.double(), want_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), want_ent, rtol=1e-5, atol=1e-5)
    for got, want in zip(g_lp + g_all, want_g_lp + want_g_all):
        assert bool(torch.isfinite(got).all())
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def _remap(targets, allowed):
    index = torch.full((int(allowed.max()) + 1,), -100, dtype=torch.long)
    index[allowed] = torch.arange(allowed.numel())
    return torch.where(targets == -100, -100, index[targets.clamp(min=0)])


def _rel(got, want):
    got, want = got.detach().double(), want.detach()
    return float((got - want).norm() / want.norm().clamp(min=1e-300))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("seed", range(CASES))
def test_strided_inputs_match_contiguous(impl, seed):
    # The same values in another memory layout (an offset view, a transposed weight) give the same answer,
    # and at large logits and a small vocabulary the entropy gradient is no worse than eager PyTorch's
    # against float64. The torch path once took a different matmul in backward for a view than in forward
    # and lost the entropy gradient (d_weight 27% off at logits ~100).
    gen = torch.Generator().manual_seed(seed)
    N = int(torch.randint(1, 30, (1,), generator=gen))
    D = int(torch.randint(1, 48, (1,), generator=gen))
    V = int(torch.randint(2, 9, (1,), generator=gen))
    scale = float(10 ** torch.empty(1).uniform_(1, 2.5, generator=gen))  # logits up to ~1e3: H is tiny
    storage = torch.randn(N * D + 8, generator=gen) * scale
    offset = int(torch.randint(1, 8, (1,), generator=gen))
    view = storage[offset : offset + N * D].view(N, D)
    w_t = torch.randn(D, V, generator=gen)  # weight = w_t.T: a transposed, non-contiguous [V, D]
    targets = torch.randint(0, V, (N,), generator=gen)

    def run(h0, w0, fn):
        h, w = h0.detach().requires_grad_(), w0.detach().requires_grad_()
        logp, ent = fn(h, w)
        grads = torch.autograd.grad(0.5 * logp.sum() + ent.sum(), (h, w))
        return (logp, ent, *grads)

    def fused(h, w):
        return fastrl.token_logprobs(h, w, targets, return_entropy=True, impl=impl)

    def eager(h, w):
        return token_logprobs_reference(h, w, targets, None, LogprobParams(1.0, -100, True))

    truth = run(view.double(), w_t.T.double(), eager)
    for h0, w0 in ((view, w_t.T), (view.clone(), w_t.T.contiguous())):
        got, ref = run(h0, w0, fused), run(h0, w0, eager)  # eager in the same layout and dtype
        for g, e, t in zip(got, ref, truth):
            assert bool(torch.isfinite(g).all())
            assert _rel(g, t) <= 2 * _rel(e, t) + 1e-4, (_rel(g, t), _rel(e, t))  # eager's, plus fp32's tolerance


@pytest.mark.parametrize("impl", IMPLS)
def test_tiny_temperature_and_empty_vocab_raise(impl):
    # Below the floor the logits overflow float32 (NaN); an empty vocabulary once divided by zero.
    hidden, weight, targets = torch.randn(3, 4), torch.randn(5, 4), torch.zeros(3, dtype=torch.long)
    for tau in (1e-39, 1e-46):
        with pytest.raises(ValueError, match="temperature"):
            fastrl.token_logprobs(hidden, weight, targets, temperature=tau, impl=impl)
    with pytest.raises(ValueError, match="V"):
        fastrl.token_logprobs(hidden, torch.randn(0, 4), torch.full((3,), -100), impl=impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_double_backward_raises(impl):
    # The backward passes are hand-written: create_graph=True must raise, not silently drop the
    # second-order term (here: the Hessian of logp w.r.t. hidden, masked by a constant outer gradient).
    hidden = torch.randn(6, 8, requires_grad=True)
    weight = torch.randn(11, 8, requires_grad=True)
    targets = torch.randint(0, 11, (6,))
    logp = fastrl.token_logprobs(hidden, weight, targets, impl=impl)
    with pytest.raises(RuntimeError, match="twice|double|second"):
        (g,) = torch.autograd.grad(logp.sum(), hidden, create_graph=True)
        torch.autograd.grad((g * g).sum() + hidden.sum(), hidden)


def test_policy_loss_double_backward():
    # The Triton policy loss has a hand-written backward: a second derivative raises. The torch path is
    # plain autograd: its second derivative is the real one (float64 agrees).
    logp = -torch.rand(2, 5)
    old, adv, mask = logp - 0.1 * torch.randn(2, 5), torch.tensor([1.0, -0.5]), torch.ones(2, 5)
    lp = logp.clone().requires_grad_()
    out = fastrl.policy_loss(lp, adv, mask, old_logprobs=old, impl="triton")
    (g,) = torch.autograd.grad(out.loss, lp, create_graph=True)
    with pytest.raises(RuntimeError, match="second derivative"):
        torch.autograd.grad((g * g).sum() + lp.sum(), lp)
    hessians = []
    for dtype in (torch.float32, torch.float64):
        lp = logp.to(dtype).requires_grad_()
        out = fastrl.policy_loss(lp, adv.to(dtype), mask, old_logprobs=old.to(dtype), impl="torch")
        (g,) = torch.autograd.grad(out.loss, lp, create_graph=True)
        (h,) = torch.autograd.grad(g.sum(), lp)
        hessians.append(h.double())
    assert bool(hessians[1].abs().sum() > 0)
    torch.testing.assert_close(hessians[0], hessians[1], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("impl", IMPLS)
def test_nonfinite_live_inputs_are_rejected_on_cpu(impl):
    # A NaN advantage or log-prob where the mask is 1 is an error naming it, not a NaN loss.
    logp, adv, mask = -torch.rand(2, 4), torch.tensor([1.0, -1.0]), torch.ones(2, 4)
    mask[1, 3] = 0
    with pytest.raises(ValueError, match="advantages is nan"):
        fastrl.policy_loss(logp, torch.tensor([float("nan"), 1.0]), mask, impl=impl)
    bad = logp.clone()
    bad[0, 2] = float("nan")
    with pytest.raises(ValueError, match=r"logprobs is nan at position \[0, 2\]"):
        fastrl.policy_loss(bad, adv, mask, impl=impl)
    bad = logp.clone()
    bad[1, 3] = float("nan")  # where the mask is 0: allowed
    assert bool(torch.isfinite(fastrl.policy_loss(bad, adv, mask, old_logprobs=bad, impl=impl).loss))
