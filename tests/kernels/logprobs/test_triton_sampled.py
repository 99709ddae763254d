"""The Triton log-prob kernels on the sampled distribution: kept-set threshold, soft-cap, per-row scale, fp32 head.

Ground truth: float64 materialized logits z = softcap(h·W + b) / τ; the kept set of vLLM V1's sampler (min-p,
then top-k, then top-p on what is left) and its midpoint threshold θ are computed from them here, and the
log-probs, entropy and every gradient come from float64 autograd with the kept set held fixed. The kernel's
error must be no worse than eager PyTorch's in the inputs' dtype (same θ) plus a per-dtype tolerance.
"""

import pytest
import torch

from fastrl.kernels import LogprobParams
from fastrl.kernels.logprobs.function import token_logprobs_triton
from fastrl.kernels.logprobs.naive import sampled_logits

EDIT_LOOP_CASES = 3  # the edit loop (-m "not slow") runs the first 3 cases of each matrix; CI runs all

TOL = {torch.float32: 1e-5, torch.float16: 5e-4, torch.bfloat16: 4e-3}
NAME = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
# The seed's kept sets are separated from the dropped tokens by several times the float32 summation noise
# (~|z|·2⁻²⁴·√D ≈ 3e-6 here), so the kernel's logits fall on the same side of θ as the float64 ones.
MIN_GAP = 2e-5


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("FASTRL_POISON", "1")


def sampler_theta(z, top_k=None, top_p=None, min_p=None):
    """vLLM V1's kept set on float64 logits z `[N, V]` → (θ `[N]`: midpoint of the lowest kept and highest
    dropped logit, −inf when nothing is dropped; the gap between those two)."""
    keep = torch.ones_like(z, dtype=torch.bool)
    if min_p is not None:
        p = torch.softmax(z, -1)
        keep &= p >= min_p * p.amax(-1, keepdim=True)
    if top_k is not None:
        kth = z.masked_fill(~keep, float("-inf")).topk(top_k, -1).values[:, -1:]
        keep &= z >= kth
    if top_p is not None:
        zs, order = z.masked_fill(~keep, float("-inf")).sort(-1, descending=True)
        probs = torch.softmax(zs, -1)
        above = probs.cumsum(-1) - probs  # mass of the tokens ranked strictly above
        keep_sorted = above < top_p
        keep &= torch.zeros_like(keep).scatter(-1, order, keep_sorted)
    lo = z.masked_fill(~keep, float("inf")).amin(-1)
    hi = z.masked_fill(keep, float("-inf")).amax(-1)
    theta = torch.where(hi == float("-inf"), float("-inf"), (lo + hi) / 2)
    return theta, lo - hi


def sampled_reference(hidden, weight, targets, bias, theta, temperature, softcap, entropy, ignore_index=-100):
    """(logp, entropy or None) of the kept set {z ≥ θ}, held fixed under autograd; ignored rows give 0."""
    z = sampled_logits(hidden, weight, bias, softcap, temperature)
    keep = (z >= theta.to(z.dtype).unsqueeze(-1)).detach()
    zk = z.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(zk, -1)
    valid = targets != ignore_index
    safe = torch.where(valid, targets, 0)
    logp = torch.where(valid, z.gather(-1, safe.unsqueeze(-1)).squeeze(-1) - lse, 0.0)
    ent = None
    if entropy:
        p = torch.exp(zk - lse.unsqueeze(-1))
        ent = torch.where(valid, lse - (p * z.masked_fill(~keep, 0.0)).sum(-1), 0.0)
    return logp, ent


def run(hidden, weight, bias, targets, theta, temperature, softcap, entropy, g, e, use_ref):
    leaves = [t.detach().requires_grad_() if t is not None else None for t in (hidden, weight, bias)]
    h, w, b = leaves
    if use_ref:
        logp, ent = sampled_reference(h, w, targets, b, theta, temperature, softcap, entropy)
    else:
        per_row = isinstance(temperature, torch.Tensor)
        params = LogprobParams(1.0 if per_row else temperature, -100, entropy, softcap)
        scale = 1.0 / temperature if per_row else None
        logp, ent = token_logprobs_triton(h, w, targets, b, params, theta=theta, row_scale=scale)
    loss = (logp * g.to(logp.dtype)).sum()
    if ent is not None:
        loss = loss + (ent * e.to(ent.dtype)).sum()
    loss.backward()
    res = {"logp": logp.detach(), "d_hidden": h.grad, "d_weight": w.grad}
    if ent is not None:
        res["entropy"] = ent.detach()
    if b is not None:
        res["d_bias"] = b.grad
    return res


def rel_err(x, ref):
    return ((x.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()


# top-k, top-p, min-p | dtype (hidden, weight) | bias | temperature ("tok": per token) | softcap | entropy
CASES = [
    ((20, None, None), (torch.float32, torch.float32), True, 0.7, None, True),
    ((None, 0.9, None), (torch.float32, torch.float32), False, 1.0, None, True),
    ((None, None, 0.05), (torch.bfloat16, torch.bfloat16), True, 1.3, None, True),
    ((50, 0.8, 0.02), (torch.float32, torch.float32), True, "tok", 5.0, True),
    ((10, 0.95, None), (torch.bfloat16, torch.bfloat16), False, "tok", 3.0, True),
    ((None, 0.7, 0.1), (torch.float16, torch.float16), True, 0.8, 4.0, False),
    ((None, None, None), (torch.float32, torch.float32), True, "tok", 2.0, True),
    ((30, 0.9, None), (torch.bfloat16, torch.float32), True, 0.9, None, True),
    ((None, 0.85, 0.05), (torch.bfloat16, torch.float32), False, "tok", 3.0, True),
    ((5, None, None), (torch.float16, torch.float32), True, 1.0, 2.5, False),
]


def case_id(c):
    (k, p, mp), (hd, wd), bias, temp, cap, ent = c
    sampler = "-".join(f"{n}{v}" for n, v in (("k", k), ("p", p), ("minp", mp)) if v is not None) or "all"
    head = NAME[hd] + ("" if hd == wd else f"-head{NAME[wd]}")
    return (
        f"N77-D120-V1001-{sampler}-{head}" + ("-bias" if bias else "") + f"-t{temp}"
        + (f"-cap{cap:g}" if cap else "") + ("-ent" if ent else "")
    )  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_sampled_logprobs_match_float64(case):
    (top_k, top_p, min_p), (h_dtype, w_dtype), with_bias, temperature, softcap, entropy = case
    n, d, v = 77, 120, 1001
    hidden = torch.randn(n, d + 8)[:, 3 : 3 + d]  # strided rows
    weight = torch.randn(v, d) * (2.0 / d**0.5)
    bias = torch.randn(v) * 0.5 if with_bias else None
    hidden, weight = hidden.to(h_dtype), weight.to(w_dtype)
    bias = bias.to(w_dtype) if bias is not None else None
    if temperature == "tok":
        temperature = torch.rand(n) + 0.5
    up = lambda t: None if t is None else t.double()  # noqa: E731
    z64 = sampled_logits(up(hidden), up(weight), up(bias), softcap, temperature)
    theta, gap = sampler_theta(z64, top_k, top_p, min_p)
    assert gap.min() > MIN_GAP, gap.min()
    targets = torch.randint(0, v, (n,))
    targets[::3] = z64.argmax(-1)[::3]  # some targets in the kept set, most outside it when it is small
    targets[torch.rand(n) < 0.15] = -100
    outside = (targets != -100) & (z64.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1) < theta)
    if top_k is not None:
        assert outside.any()
    theta32 = theta.float()
    g, e = torch.randn(n), torch.randn(n)
    args = (targets, theta32, temperature, softcap, entropy, g, e)
    truth = run(up(hidden), up(weight), up(bias), *args, use_ref=True)
    eager = run(hidden, weight, bias, *args, use_ref=True)
    got = run(hidden, weight, bias, *args, use_ref=False)

    assert got.keys() == truth.keys()
    assert got["logp"].dtype == torch.float32
    assert got["d_hidden"].dtype == h_dtype and got["d_weight"].dtype == w_dtype
    ignored = targets == -100
    assert (got["logp"][ignored] == 0).all() and (got["d_hidden"][ignored] == 0).all()
    for name, ref in truth.items():
        assert torch.isfinite(got[name]).all(), name
        err, err_eager = rel_err(got[name], ref), rel_err(eager[name], ref)
        assert err <= err_eager + TOL[h_dtype], f"{name}: triton err {err:.2e} vs eager {err_eager:.2e}"


def test_theta_minus_inf_and_no_cap_equal_the_plain_kernels():
    # θ = −inf everywhere keeps every token: the same numbers as the call without θ (and a row scale of 1).
    hidden, weight = torch.randn(40, 32), torch.randn(300, 32) * 0.4
    targets = torch.randint(0, 300, (40,))
    params = LogprobParams(0.8, -100, True)
    plain = token_logprobs_triton(hidden, weight, targets, None, params)
    theta = torch.full((40,), float("-inf"))
    kept_all = token_logprobs_triton(hidden, weight, targets, None, params, theta=theta, row_scale=torch.ones(40))
    for a, b in zip(plain, kept_all):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_saturated_softcap_and_banned_tokens_stay_finite():
    # Logits of a few hundred saturate the cap (tanh → ±1, derivative → 0) and a −inf bias becomes −cap,
    # kept (θ = −inf rows) or dropped (θ = 0 rows): every output and gradient is finite and matches float64.
    hidden = torch.randn(33, 16) * 4
    weight = torch.randn(200, 16) * 4
    bias = torch.randn(200)
    bias[::17] = float("-inf")
    targets = torch.randint(0, 200, (33,))
    z64 = sampled_logits(hidden.double(), weight.double(), bias.double(), 10.0, 1.0)
    theta = torch.zeros(33)
    theta[::2] = float("-inf")
    assert z64.abs().min() > MIN_GAP
    g, e = torch.randn(33), torch.randn(33)
    args = (targets, theta, 1.0, 10.0, True, g, e)
    got = run(hidden, weight, bias, *args, use_ref=False)
    truth = run(hidden.double(), weight.double(), bias.double(), *args, use_ref=True)
    eager = run(hidden, weight, bias, *args, use_ref=True)
    for name, ref in truth.items():
        assert torch.isfinite(got[name]).all(), name
        err, err_eager = rel_err(got[name], ref), rel_err(eager[name], ref)
        assert err <= err_eager + TOL[torch.float32], f"{name}: triton err {err:.2e} vs eager {err_eager:.2e}"


@pytest.mark.parametrize(
    "bad, err, match",
    [
        ({"theta": torch.zeros(5)}, ValueError, "theta must be"),
        ({"theta": torch.zeros(7, dtype=torch.long)}, TypeError, "theta must be"),
        ({"row_scale": torch.ones(7, 1)}, ValueError, "row_scale must be"),
        ({"weight": torch.randn(50, 16, dtype=torch.float16)}, TypeError, "float32 head"),
        ({"params": LogprobParams(softcap=-1.0)}, ValueError, "softcap"),
    ],
    ids=["theta-shape", "theta-int", "row-scale-shape", "fp16-head", "negative-softcap"],
)
def test_bad_inputs_raise_naming_the_value(bad, err, match):
    kw = {"weight": torch.randn(50, 16), "params": LogprobParams(), **bad}
    weight, params = kw.pop("weight"), kw.pop("params")
    with pytest.raises(err, match=match):
        token_logprobs_triton(torch.randn(7, 16), weight, torch.zeros(7, dtype=torch.long), None, params, **kw)
