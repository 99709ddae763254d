"""grpo_loss's gradient-in-forward path (docs/math.md §7): oracle, the two-pass path, additivity, edge cases."""

import pytest
import torch
from loss_oracle import oracle_logprobs, oracle_loss

import fastrl.kernels.fused_loss.api as fused_api
from fastrl import LossConfig, grpo_loss, policy_loss, token_logprobs

IMPLS = ["torch", "triton"]

TOKEN_CONFIGS = {
    "grpo-k3-ent-dual-is-tau": LossConfig(
        loss_agg="grpo", beta=0.04, entropy_coef=0.02, dual_clip=2.0, is_cap=2.0, temperature=0.7
    ),
    "token-mean-k2-ent-is": LossConfig(loss_agg="token-mean", beta=0.1, kl="k2", entropy_coef=-0.01, is_cap=1.1),
    "drgrpo-k1-cliphigher": LossConfig(loss_agg="dr_grpo", max_completion_length=9, beta=0.1, kl="k1", eps_high=0.28),
    "seq-sum-plain": LossConfig(loss_agg="seq-mean-token-sum"),
}


def make_inputs(B=3, T=7, D=24, V=53, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = dict(
        hidden=torch.randn(B, T, D, generator=g, dtype=torch.float64),
        weight=torch.randn(V, D, generator=g, dtype=torch.float64) / D**0.5,
        bias=0.1 * torch.randn(V, generator=g, dtype=torch.float64),
        targets=torch.randint(0, V, (B, T), generator=g),
        mask=torch.ones(B, T, dtype=torch.bool),
    )
    x["mask"][0, T - 2 :] = False
    x["mask"][B - 1, 2:] = False
    x["targets"][0, T - 1] = -100
    x["old"] = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4 - 2
    x["ref"] = x["old"] + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    x["rollout"] = x["old"] + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    x["adv"] = torch.randn(B, T, generator=g, dtype=torch.float64)
    x["tau"] = 0.5 + torch.rand(B, T, generator=g, dtype=torch.float64)
    return x


def _leaves(x, dtype):
    return [x[k].to(dtype).clone().requires_grad_(True) for k in ("hidden", "weight", "bias")]


def _kwargs(x, cfg):
    f32 = {k: x[k].float() for k in ("old", "ref", "rollout", "adv")}
    return dict(
        old_logprobs=f32["old"],
        ref_logprobs=f32["ref"],
        rollout_logprobs=f32["rollout"] if cfg.is_cap else None,
        config=cfg,
    ), f32["adv"]


def _oracle(x, cfg, tau, normalizer=None):
    h64, w64, b64 = _leaves(x, torch.float64)
    safe = torch.where(x["mask"], x["targets"], 0)
    lp, ent = oracle_logprobs(h64, w64, safe, b64, tau, True)
    rollout = x["rollout"] if cfg.is_cap else None
    loss = oracle_loss(
        lp, x["adv"], x["mask"], cfg, old=x["old"], ref=x["ref"], rollout=rollout, entropy=ent, normalizer=normalizer
    )
    return loss, torch.autograd.grad(loss, (h64, w64, b64)), ent


@pytest.fixture
def fused_calls(monkeypatch):
    """Counts the gradient-in-forward passes (the test fails if a path it expects is not the one taken)."""
    calls = []
    real = fused_api.fused_forward

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(fused_api, "fused_forward", counting)
    return calls


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("per_token_tau", [False, True], ids=["tau-float", "tau-tensor"])
@pytest.mark.parametrize("name", list(TOKEN_CONFIGS))
def test_fused_matches_oracle(name, per_token_tau, impl, fused_calls):
    cfg = TOKEN_CONFIGS[name]
    x = make_inputs()
    tau = x["tau"].unsqueeze(-1) if per_token_tau else cfg.temperature
    loss64, grads64, _ = _oracle(x, cfg, tau)
    h, w, b = _leaves(x, torch.float32)
    kw, adv = _kwargs(x, cfg)
    temperature = x["tau"].float() if per_token_tau else None
    out = grpo_loss(h, w, x["targets"], x["mask"], adv, bias=b, impl=impl, temperature=temperature, **kw)
    assert fused_calls, "the gradient-in-forward path was not taken"
    out.loss.backward()
    torch.testing.assert_close(out.loss.double(), loss64, rtol=1e-5, atol=1e-6)
    for got, want in zip((h.grad, w.grad, b.grad), grads64):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_fused_equals_two_pass_path_and_its_metrics(impl):
    cfg = TOKEN_CONFIGS["grpo-k3-ent-dual-is-tau"]
    x = make_inputs(B=4, T=9, D=16, V=77, seed=3)
    kw, adv = _kwargs(x, cfg)
    h, w, b = _leaves(x, torch.float32)
    out = grpo_loss(h, w, x["targets"], x["mask"], adv, bias=b, impl=impl, **kw)
    out.loss.backward()
    h2, w2, b2 = _leaves(x, torch.float32)
    live = torch.where(x["mask"], x["targets"], -100)
    lp, ent = token_logprobs(h2, w2, live, bias=b2, temperature=cfg.temperature, return_entropy=True, impl=impl)
    two_pass = policy_loss(lp, adv, x["mask"], entropy=ent, impl=impl, **kw)
    two_pass.loss.backward()
    torch.testing.assert_close(out.loss, two_pass.loss, rtol=1e-6, atol=1e-7)
    assert out.metrics.keys() == two_pass.metrics.keys()
    for key in out.metrics:
        torch.testing.assert_close(out.metrics[key], two_pass.metrics[key], rtol=1e-6, atol=1e-7)
    for got, want in zip((h.grad, w.grad, b.grad), (h2.grad, w2.grad, b2.grad)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batches_add_up_with_the_global_normalizer(agg, impl):
    cfg = LossConfig(loss_agg=agg, beta=0.05, entropy_coef=0.01)
    x = make_inputs(B=4, T=6, D=12, V=41, seed=5)
    kw, adv = _kwargs(x, cfg)
    count = x["mask"].sum() if agg == "token-mean" else 4
    h, w, b = _leaves(x, torch.float32)
    full = grpo_loss(h, w, x["targets"], x["mask"], adv, bias=b, impl=impl, normalizer=count, **kw).loss
    full_grads = torch.autograd.grad(full, (h, w, b))
    total, grads = 0.0, [torch.zeros_like(t) for t in (h, w, b)]
    for rows in (slice(0, 1), slice(1, 4)):
        part_kw = {k: (v[rows] if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        loss = grpo_loss(
            h[rows], w, x["targets"][rows], x["mask"][rows], adv[rows], bias=b, impl=impl, normalizer=count, **part_kw
        ).loss
        for acc, g in zip(grads, torch.autograd.grad(loss, (h, w, b))):
            acc += g
        total += loss.item()
    torch.testing.assert_close(torch.tensor(total), full.detach(), rtol=1e-6, atol=1e-7)
    for got, want in zip(grads, full_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("impl", IMPLS)
def test_all_masked_is_exactly_zero_with_zero_grads(impl, fused_calls):
    cfg = LossConfig(beta=0.1, entropy_coef=0.01)
    x = make_inputs()
    kw, adv = _kwargs(x, cfg)
    h, w, b = _leaves(x, torch.float32)
    with torch.no_grad():
        h[0, 0] = float("nan")  # masked rows are never read
    mask = torch.zeros_like(x["mask"])
    out = grpo_loss(h, w, x["targets"], mask, adv, bias=b, impl=impl, **kw)
    out.loss.backward()
    assert fused_calls
    assert out.loss.item() == 0.0
    for g in (h.grad, w.grad, b.grad):
        assert torch.equal(g, torch.zeros_like(g))


def test_no_grad_and_frozen_inputs_do_no_gradient_work(fused_calls):
    cfg = LossConfig(beta=0.1)
    x = make_inputs()
    kw, adv = _kwargs(x, cfg)
    h, w, b = _leaves(x, torch.float32)
    with torch.no_grad():
        a = grpo_loss(h, w, x["targets"], x["mask"], adv, bias=b, impl="torch", **kw)
    frozen = [t.detach() for t in (h, w, b)]
    c = grpo_loss(*frozen[:2], x["targets"], x["mask"], adv, bias=frozen[2], impl="torch", **kw)
    assert not fused_calls
    assert not a.loss.requires_grad and not c.loss.requires_grad
    d = grpo_loss(h, w, x["targets"], x["mask"], adv, bias=b, impl="torch", **kw)
    assert fused_calls
    assert a.loss.item() == c.loss.item()
    torch.testing.assert_close(d.loss.detach(), a.loss, rtol=1e-6, atol=1e-7)


def test_a_second_backward_raises_and_double_backward_raises():
    x = make_inputs()
    cfg = LossConfig(beta=0.1)
    kw, adv = _kwargs(x, cfg)
    h, w, b = _leaves(x, torch.float32)
    loss = grpo_loss(h, w, x["targets"], x["mask"], adv, bias=b, impl="torch", **kw).loss
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()
    loss = grpo_loss(h, w, x["targets"], x["mask"], adv, bias=b, impl="torch", **kw).loss
    (g,) = torch.autograd.grad(loss, h, create_graph=True)
    # another term keeps the double backward alive: this op's second-order part must raise, not be dropped
    with pytest.raises(RuntimeError, match="differentiable once"):
        (g.sum() + h.square().sum()).backward()


def test_grad_output_scales_and_tied_weight_sums():
    x = make_inputs()
    cfg = LossConfig(loss_agg="grpo", beta=0.1)
    kw, adv = _kwargs(x, cfg)
    h, w, b = _leaves(x, torch.float32)
    loss = grpo_loss(h, w, x["targets"], x["mask"], adv, bias=b, impl="torch", **kw).loss
    grads = torch.autograd.grad(loss, (h, w, b))
    h2, w2, b2 = _leaves(x, torch.float32)
    loss2 = grpo_loss(h2, w2, x["targets"], x["mask"], adv, bias=b2, impl="torch", **kw).loss
    embed = torch.nn.functional.embedding(x["targets"].clamp(min=0), w2).sum()  # the tied input embedding
    (-3.0 * loss2 + embed).backward()
    (embed_grad,) = torch.autograd.grad(torch.nn.functional.embedding(x["targets"].clamp(min=0), w).sum(), w)
    torch.testing.assert_close(h2.grad, -3.0 * grads[0])
    torch.testing.assert_close(w2.grad, -3.0 * grads[1] + embed_grad)
    torch.testing.assert_close(b2.grad, -3.0 * grads[2])


def test_the_weight_gradient_taken_out_is_the_weights_and_the_backward_leaves_it_alone():
    from fastrl.kernels import take_weight_gradient

    x = make_inputs()
    cfg = LossConfig(loss_agg="grpo", beta=0.1)
    kw, adv = _kwargs(x, cfg)
    h, w, b = _leaves(x, torch.float32)
    grads = torch.autograd.grad(
        grpo_loss(h, w, x["targets"], x["mask"], adv, bias=b, impl="torch", **kw).loss, (h, w, b)
    )
    loss = grpo_loss(h, w, x["targets"], x["mask"], adv, bias=b, impl="torch", **kw).loss
    taken = take_weight_gradient(loss)
    assert take_weight_gradient(loss) is None  # taken once
    torch.testing.assert_close(taken, grads[1])
    loss.backward()
    assert w.grad is None  # the caller owns it now
    torch.testing.assert_close(h.grad, grads[0])
    torch.testing.assert_close(b.grad, grads[2])
    loss = grpo_loss(h, w, x["targets"], x["mask"], adv, bias=b, impl="torch", **kw).loss
    take_weight_gradient(loss)
    with pytest.raises(RuntimeError, match="grad_output 2.0 after the weight's gradient was taken"):
        (2.0 * loss).backward()
    assert (
        take_weight_gradient(policy_loss(torch.zeros(2, 3, requires_grad=True), torch.ones(2), torch.ones(2, 3)).loss)
        is None
    )


@pytest.mark.parametrize("impl", IMPLS)
def test_entropy_metric_from_the_same_pass(impl, fused_calls):
    cfg = LossConfig(beta=0.04, temperature=0.8)
    x = make_inputs()
    kw, adv = _kwargs(x, cfg)
    _, _, ent64 = _oracle(x, cfg, cfg.temperature)
    h, w, b = _leaves(x, torch.float32)
    plain = grpo_loss(h, w, x["targets"], x["mask"], adv, bias=b, impl=impl, **kw)
    assert "entropy_mean" not in plain.metrics
    with_h = grpo_loss(h, w, x["targets"], x["mask"], adv, bias=b, impl=impl, return_entropy=True, **kw)
    assert len(fused_calls) == 2
    want = (ent64 * x["mask"]).sum() / x["mask"].sum()
    torch.testing.assert_close(with_h.metrics["entropy_mean"].double(), want, rtol=1e-5, atol=1e-6)
    assert with_h.loss.item() == plain.loss.item()
    for got, want in zip(torch.autograd.grad(with_h.loss, (h, w, b)), torch.autograd.grad(plain.loss, (h, w, b))):
        torch.testing.assert_close(got, want)
    with torch.no_grad():  # the two-pass path reports it too
        nograd = grpo_loss(h, w, x["targets"], x["mask"], adv, bias=b, impl=impl, return_entropy=True, **kw)
    torch.testing.assert_close(nograd.metrics["entropy_mean"], with_h.metrics["entropy_mean"])


@pytest.mark.parametrize("impl", IMPLS)
def test_bf16_inputs_match_float32_within_bf16_error(impl):
    cfg = LossConfig(loss_agg="grpo", beta=0.04, entropy_coef=0.01)
    x = make_inputs(B=2, T=8, D=32, V=64, seed=2)
    kw, adv = _kwargs(x, cfg)
    h16, w16, b16 = _leaves(x, torch.bfloat16)
    out16 = grpo_loss(h16, w16, x["targets"], x["mask"], adv, bias=b16, impl=impl, **kw)
    grads16 = torch.autograd.grad(out16.loss, (h16, w16, b16))
    assert [g.dtype for g in grads16] == [torch.bfloat16] * 3
    h, w, b = [t.detach().float().requires_grad_() for t in (h16, w16, b16)]
    out = grpo_loss(h, w, x["targets"], x["mask"], adv, bias=b, impl=impl, **kw)
    grads = torch.autograd.grad(out.loss, (h, w, b))
    torch.testing.assert_close(out16.loss, out.loss, rtol=2e-2, atol=2e-3)
    for got, want in zip(grads16, grads):
        torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=3e-3 * want.abs().max().item())


def test_many_small_chunks_equal_one_chunk(monkeypatch):
    cfg = TOKEN_CONFIGS["grpo-k3-ent-dual-is-tau"]
    x = make_inputs(B=5, T=11, D=8, V=29, seed=4)
    kw, adv = _kwargs(x, cfg)
    results = []
    for budget in ("16", str(2**26)):  # 16 bytes → 16-row chunks; 64 MiB → one chunk
        monkeypatch.setenv("FASTRL_CHUNK_BYTES", budget)
        h, w, b = _leaves(x, torch.float32)
        loss = grpo_loss(h, w, x["targets"], x["mask"], adv, bias=b, impl="torch", **kw).loss
        results.append((loss.detach(), torch.autograd.grad(loss, (h, w, b))))
    torch.testing.assert_close(results[0][0], results[1][0])
    for got, want in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "tau, match",
    [
        (torch.zeros(3, 7), "finite and >= 1e-06"),
        (torch.full((3, 7), float("nan")), "finite and >= 1e-06"),
        (torch.ones(3, 6), r"shape \(3, 7\)"),
        (torch.ones(3, 7, dtype=torch.int64), "floating"),
        (0.7, "None .* or a \\[B, T\\] tensor"),
    ],
)
def test_bad_per_token_temperature_raises(tau, match):
    x = make_inputs()
    h, w, b = _leaves(x, torch.float32)
    with pytest.raises((ValueError, TypeError), match=match):
        grpo_loss(h, w, x["targets"], x["mask"], x["adv"].float(), bias=b, impl="torch", temperature=tau)


@pytest.mark.parametrize("impl", IMPLS)
def test_token_logprobs_per_token_temperature_matches_float64(impl):
    x = make_inputs(B=2, T=5, D=16, V=37, seed=6)
    tau = x["tau"]
    live = torch.where(x["mask"], x["targets"], -100)
    h64, w64 = (x[k].clone().requires_grad_() for k in ("hidden", "weight"))
    lp64, ent64 = oracle_logprobs(h64, w64, live, None, tau.unsqueeze(-1), True)
    up = torch.randn(2, 5, dtype=torch.float64)
    grads64 = torch.autograd.grad((lp64 * up).sum() + (ent64 * up).sum(), (h64, w64))
    h, w = (x[k].float().requires_grad_() for k in ("hidden", "weight"))
    lp, ent = token_logprobs(h, w, live, temperature=tau.float(), return_entropy=True, impl=impl)
    torch.testing.assert_close(lp.double(), lp64, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent.double(), ent64, rtol=1e-5, atol=1e-6)
    for got, want in zip(torch.autograd.grad((lp * up.float()).sum() + (ent * up.float()).sum(), (h, w)), grads64):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-6)
    # with a bias too: z = (h·W + b) / τ_t, one rule on every path (it used to be refused here)
    b64 = x["bias"].clone()
    lp64_b, _ = oracle_logprobs(x["hidden"], x["weight"], live, b64, tau.unsqueeze(-1), True)
    lp_b = token_logprobs(h, w, live, bias=b64.float(), temperature=tau.float(), impl=impl)
    torch.testing.assert_close(lp_b.double(), lp64_b, rtol=1e-5, atol=1e-6)


def test_sequence_ratio_takes_a_per_token_temperature_through_the_two_pass_path(fused_calls):
    cfg = LossConfig(ratio_level="sequence", beta=0.04)
    x = make_inputs()
    kw, adv = _kwargs(x, cfg)
    loss64, grads64, _ = _oracle(dict(x, bias=torch.zeros_like(x["bias"])), cfg, x["tau"].unsqueeze(-1))
    h, w = (x[k].float().requires_grad_() for k in ("hidden", "weight"))
    out = grpo_loss(h, w, x["targets"], x["mask"], adv, temperature=x["tau"].float(), impl="torch", **kw)
    assert not fused_calls
    torch.testing.assert_close(out.loss.double(), loss64, rtol=1e-5, atol=1e-6)
    for got, want in zip(torch.autograd.grad(out.loss, (h, w)), grads64[:2]):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-6)
