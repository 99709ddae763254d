"""token_logprobs with vLLM's truncation (top-k, top-p, min-p), the soft-cap and a float32 head, against the
materialized float64 reference of docs/math.md §8: logp, entropy and every gradient, and the kept sets.

The kernel's error must be no worse than the eager float32 reference's plus about one float32 ulp.
"""

import pytest
import torch

import fastrl
from fastrl.kernels.logprobs import bwd, fwd
from fastrl.kernels.logprobs.naive import sampled_logprobs_reference
from fastrl.kernels.logprobs.params import LogprobParams
from fastrl.kernels.logprobs.sampled import sampled_forward
from fastrl.kernels.logprobs.sampling import truncation

IMPLS = ("torch", "triton")
TOL = 1e-5
N, D, V = 77, 120, 1001

OPTIONS = {
    "topk50": dict(top_k=50),
    "topp0.9": dict(top_p=0.9),
    "minp0.1": dict(min_p=0.1),
    "all": dict(top_k=200, top_p=0.8, min_p=0.02),
    "cap3": dict(softcap=3.0),
    "topp0.7-cap2": dict(top_p=0.7, softcap=2.0),
}


def make_inputs(with_bias=True, ignore_frac=0.15, n=N):
    hidden = torch.randn(n, D)
    weight = torch.randn(V, D) * (2.0 / D**0.5)
    bias = torch.randn(V) * 0.5 if with_bias else None
    targets = torch.randint(0, V, (n,))
    targets[torch.rand(n) < ignore_frac] = -100
    return hidden, weight, bias, targets


def _rows(value, n, dtype):
    return None if value is None else torch.full((n,), value, dtype=dtype)


def reference(hidden, weight, bias, targets, tau, opts, dtype, g, e):
    leaves = [None if t is None else t.detach().to(dtype).requires_grad_() for t in (hidden, weight, bias)]
    n = targets.shape[0]
    out = sampled_logprobs_reference(
        leaves[0], leaves[1], targets, leaves[2], temperature=tau.to(dtype) if torch.is_tensor(tau) else tau,
        softcap=opts.get("softcap"), top_k=_rows(opts.get("top_k"), n, torch.long),
        top_p=_rows(opts.get("top_p"), n, dtype), min_p=_rows(opts.get("min_p"), n, dtype),
    )  # fmt: skip
    (out["logp"] * g.to(dtype) + out["entropy"] * e.to(dtype)).sum().backward()
    res = {"logp": out["logp"].detach(), "entropy": out["entropy"].detach(), "d_hidden": leaves[0].grad}
    res["d_weight"] = leaves[1].grad
    if bias is not None:
        res["d_bias"] = leaves[2].grad
    return res, out["kept"]


def run(impl, hidden, weight, bias, targets, tau, opts, g, e):
    leaves = [None if t is None else t.detach().requires_grad_() for t in (hidden, weight, bias)]
    logp, ent = fastrl.token_logprobs(
        leaves[0], leaves[1], targets, bias=leaves[2], temperature=tau, return_entropy=True, impl=impl, **opts
    )
    (logp * g + ent * e).sum().backward()
    res = {"logp": logp.detach(), "entropy": ent.detach(), "d_hidden": leaves[0].grad, "d_weight": leaves[1].grad}
    if bias is not None:
        res["d_bias"] = leaves[2].grad
    return res


def rel_err(x, ref):
    return ((x.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-12)).item()


def spy_triton(monkeypatch) -> dict:
    """Count the Triton forward and ∂z launches: an impl="triton" test must reach them, not fall back to torch."""
    calls = {"fwd": 0, "bwd": 0}
    for module, name, key in ((fwd, "logprob_partials", "fwd"), (bwd, "logprob_backward", "bwd")):
        real = getattr(module, name)

        def counted(*args, _real=real, _key=key, **kwargs):
            calls[_key] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("per_token", [False, True], ids=["tau-scalar", "tau-per-token"])
@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("impl", IMPLS)
def test_matches_float64_no_worse_than_eager(monkeypatch, impl, name, per_token):
    opts = OPTIONS[name]
    calls = spy_triton(monkeypatch)
    hidden, weight, bias, targets = make_inputs()
    tau = torch.rand(N) + 0.5 if per_token else 0.7
    g, e = torch.randn(N), torch.randn(N)
    truth, kept = reference(hidden, weight, bias, targets, tau, opts, torch.float64, g, e)
    eager, _ = reference(hidden, weight, bias, targets, tau, opts, torch.float32, g, e)
    got = run(impl, hidden, weight, bias, targets, tau, opts, g, e)
    # per-token τ with a bias (and a cap) runs the Triton kernels, forward and backward, when asked for
    assert calls == ({"fwd": 1, "bwd": 1} if impl == "triton" else {"fwd": 0, "bwd": 0}), calls
    assert set(got) == set(truth)
    for key, ref in truth.items():
        assert torch.isfinite(got[key]).all(), key
        assert rel_err(got[key], ref) <= rel_err(eager[key], ref) + TOL, (key, rel_err(got[key], ref))
    if "softcap" not in opts or len(opts) > 1:
        assert (kept.sum(1) < V).any()  # the case truncates


@pytest.mark.parametrize("name", [n for n in OPTIONS if n != "cap3"])
def test_kept_set_is_the_references(monkeypatch, name):
    # small tiles: the threshold is found in several row chunks and recomputed by the backward in others
    monkeypatch.setenv("FASTRL_CHUNK_BYTES", str(20 * 4 * V * 16))
    opts = OPTIONS[name]
    hidden, weight, bias, targets = make_inputs(ignore_frac=0.0)
    tau = 0.7
    trunc = truncation(opts.get("top_k"), opts.get("top_p"), opts.get("min_p"), targets.shape, V, hidden.device)
    params = LogprobParams(tau, -100, False, opts.get("softcap"))
    out, stats = sampled_forward(hidden, weight, targets, bias, trunc, params)
    theta = stats[3]
    _, kept = reference(hidden, weight, bias, targets, tau, opts, torch.float64, torch.zeros(N), torch.zeros(N))
    z = torch.addmm(bias.double(), hidden.double(), weight.double().T)
    if "softcap" in opts:
        z = opts["softcap"] * torch.tanh(z / opts["softcap"])
    z = z / tau
    assert torch.equal(z >= theta.double().unsqueeze(1), kept)
    assert torch.equal(out.outside, ~kept.gather(1, targets.unsqueeze(1)).squeeze(1))


@pytest.mark.parametrize("name", ["all", "topp0.7-cap2"])
def test_small_tiles_match_float64(monkeypatch, name):
    # row chunks of 16 in the forward, vocabulary chunks of ~100 columns in the backward
    monkeypatch.setenv("FASTRL_CHUNK_BYTES", str(12 * N * 100))
    opts = OPTIONS[name]
    hidden, weight, bias, targets = make_inputs()
    tau = torch.rand(N) + 0.5
    g, e = torch.randn(N), torch.randn(N)
    truth, _ = reference(hidden, weight, bias, targets, tau, opts, torch.float64, g, e)
    eager, _ = reference(hidden, weight, bias, targets, tau, opts, torch.float32, g, e)
    got = run("torch", hidden, weight, bias, targets, tau, opts, g, e)
    for key, ref in truth.items():
        assert rel_err(got[key], ref) <= rel_err(eager[key], ref) + TOL, (key, rel_err(got[key], ref))


@pytest.mark.parametrize("impl", IMPLS)
def test_targets_outside_the_kept_set_stay_finite(impl):
    hidden, weight, bias, targets = make_inputs(ignore_frac=0.0)
    logits = torch.addmm(bias, hidden, weight.T)
    targets = logits.argmin(1)  # the least likely token: outside any top-k 50
    hidden.requires_grad_()
    logp, ent = fastrl.token_logprobs(hidden, weight, targets, bias=bias, top_k=50, return_entropy=True, impl=impl)
    (logp.sum() + ent.sum()).backward()
    assert torch.isfinite(logp).all() and torch.isfinite(ent).all() and torch.isfinite(hidden.grad).all()
    top = logits.topk(50, 1).values
    expected = logits.gather(1, targets.unsqueeze(1)).squeeze(1) - top.logsumexp(1)  # z_y − lse_S
    torch.testing.assert_close(logp, expected, rtol=1e-5, atol=1e-5)


def test_ignored_rows_may_hold_nan():
    hidden, weight, bias, targets = make_inputs()
    hidden[targets == -100] = float("nan")
    leaves = [t.requires_grad_() for t in (hidden, weight, bias)]
    logp, ent = fastrl.token_logprobs(*leaves[:2], targets, bias=leaves[2], top_p=0.9, return_entropy=True)
    (logp.sum() + ent.sum()).backward()
    for t in (logp, ent, *(x.grad for x in leaves)):
        assert torch.isfinite(t).all()
    assert (logp[targets == -100] == 0).all() and (hidden.grad[targets == -100] == 0).all()


def test_off_values_are_the_plain_call():
    hidden, weight, bias, targets = make_inputs()
    plain = fastrl.token_logprobs(hidden, weight, targets, bias=bias, return_entropy=True)
    off = fastrl.token_logprobs(hidden, weight, targets, bias=bias, return_entropy=True, top_k=0, top_p=1.0,
                                min_p=0.0)  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(plain, off))
    plain_logp = fastrl.token_logprobs(hidden, weight, targets, bias=bias)  # the same call without the entropy
    for k in (-1, V):
        assert torch.equal(fastrl.token_logprobs(hidden, weight, targets, bias=bias, top_k=k), plain_logp)


def test_per_row_settings_broadcast_over_the_sequence():
    hidden, weight, _, targets = make_inputs(with_bias=False, n=3 * 20)
    hidden, targets = hidden.reshape(3, 20, D), targets.reshape(3, 20)
    top_p = torch.tensor([0.5, 1.0, 0.9])
    got = fastrl.token_logprobs(hidden, weight, targets, top_p=top_p)
    for i in range(3):
        one = fastrl.token_logprobs(hidden[i], weight, targets[i], top_p=float(top_p[i]))
        torch.testing.assert_close(got[i], one, rtol=0, atol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", ["plain", "topp0.9"])
def test_half_hidden_with_a_float32_head(impl, half, name):
    opts = {} if name == "plain" else OPTIONS[name]
    hidden, weight, bias, targets = make_inputs()
    hidden = hidden.to(half)
    g, e = torch.randn(N), torch.randn(N)
    # the float32 head's own computation: the hidden states upcast, everything else float32
    truth, _ = reference(hidden.float(), weight, bias, targets, 1.0, opts, torch.float64, g, e)
    eager, _ = reference(hidden.float(), weight, bias, targets, 1.0, opts, torch.float32, g, e)
    got = run(impl, hidden, weight, bias, targets, 1.0, opts, g, e)
    assert got["d_hidden"].dtype == half and got["d_weight"].dtype == torch.float32
    for key in ("logp", "entropy", "d_weight", "d_bias"):
        assert rel_err(got[key], truth[key]) <= rel_err(eager[key], truth[key]) + TOL, key
    hidden_tol = {torch.bfloat16: 4e-3, torch.float16: 5e-4}[half]  # d_hidden is rounded to hidden's dtype
    assert rel_err(got["d_hidden"], truth["d_hidden"]) <= hidden_tol


@pytest.mark.parametrize("truncate", [False, True], ids=["full", "topp0.8"])
def test_return_topk(truncate):
    hidden, weight, bias, targets = make_inputs()
    opts = dict(top_p=0.8) if truncate else {}
    logp, ids, lps = fastrl.token_logprobs(hidden, weight, targets, bias=bias, return_topk=5, **opts)
    ref = sampled_logprobs_reference(hidden.double(), weight.double(), targets, bias.double(), return_topk=5,
                                     top_p=_rows(opts.get("top_p"), N, torch.float64))  # fmt: skip
    live = targets != -100
    assert ids.shape == (N, 5) and lps.shape == (N, 5) and not lps.requires_grad
    assert torch.equal(ids[live], ref["topk_ids"][live])
    torch.testing.assert_close(lps[live], ref["topk_logprobs"][live].float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logp, ref["logp"].float(), rtol=1e-5, atol=1e-5)


def test_bad_options_raise():
    hidden, weight, _, targets = make_inputs(with_bias=False)
    call = lambda **kw: fastrl.token_logprobs(hidden, weight, targets, **kw)  # noqa: E731
    with pytest.raises(ValueError, match="top_p"):
        call(top_p=0.0)
    with pytest.raises(ValueError, match="min_p"):
        call(min_p=1.5)
    with pytest.raises(TypeError, match="top_k"):
        call(top_k=5.0)
    with pytest.raises(TypeError, match="top_k"):
        call(top_k=True)
    with pytest.raises(ValueError, match="softcap"):
        call(softcap=-1.0)
    with pytest.raises(ValueError, match="return_topk"):
        call(return_topk=V + 1)
    with pytest.raises(ValueError, match="top_p"):
        call(top_p=torch.ones(5))
    with pytest.raises(TypeError, match="hidden and weight"):
        fastrl.token_logprobs(hidden, weight.bfloat16(), targets, top_p=0.9)
