"""The float32 CPU walk of the gradient-in-forward op (`lean_forward`, fastrl/kernels/fused_loss/api.py) against
float64 truth.

Each case is run through `fused_logprob_grads` with a per-token loss ℓ = a·logp (+ an entropy metric), and
compared with the materialized float64 logits differentiated by autograd. The cases reach every branch of the
walk: the target shift, the rows redone with the max shift (a target far below the max), bias, a per-token
temperature, the entropy metric, several chunks, masked rows.
"""

import pytest
import torch

from fastrl.kernels import LogprobParams, LogprobRequest, logprob_call, token_logprobs_reference
from fastrl.kernels.fused_loss import FusedLossParams, fused_logprob_grads
from fastrl.kernels.fused_loss import api as lean_mod


def _case(n=37, d=24, v=300, scale=1.0, bias=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=gen, dtype=torch.float64)
    w = torch.randn(v, d, generator=gen, dtype=torch.float64) * (scale / d**0.5)
    b = torch.randn(v, generator=gen, dtype=torch.float64) if bias else None
    y = torch.randint(0, v, (n,), generator=gen)
    y[::7] = -100
    a = torch.randn(n, generator=gen, dtype=torch.float64)
    return h, w, b, y, a


def _truth(h, w, b, y, a, tau):
    live = y >= 0
    hl = h[live].detach().requires_grad_()
    wl = w.detach().requires_grad_()
    bl = None if b is None else b.detach().requires_grad_()
    t = tau[live] if isinstance(tau, torch.Tensor) else tau
    z = (hl @ wl.T + (0 if bl is None else bl)) / (t.unsqueeze(-1) if isinstance(t, torch.Tensor) else t)
    logp_all = z.log_softmax(-1)
    logp = logp_all.gather(-1, y[live].unsqueeze(-1)).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    (a[live] * logp).sum().backward()
    d_h = torch.zeros_like(h)
    d_h[live] = hl.grad
    full = torch.zeros(h.shape[0], dtype=h.dtype)
    full_e = torch.zeros_like(full)
    full[live], full_e[live] = logp.detach(), ent.detach()
    return full, full_e, d_h, wl.grad, None if bl is None else bl.grad


def _run(h, w, b, y, a, tau, entropy=False):
    a32 = a.float()

    def token_grad(idx, logp, ent):
        return a32.index_select(0, idx), None

    h32, w32 = h.float().requires_grad_(), w.float().requires_grad_()
    b32 = None if b is None else b.float().requires_grad_()
    t32 = tau.float() if isinstance(tau, torch.Tensor) else tau
    request = LogprobRequest(bias=b32, temperature=t32, return_entropy=entropy, impl="torch")  # the sampler off
    call, _ = logprob_call(h32, w32, y, request)
    return fused_logprob_grads(call, token_grad, entropy_grad=False)


def _close(got, want, rtol=2e-5, atol=2e-5):
    # float32 against float64 truth: the float32 GEMMs' rounding, relative to the largest entry
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol * float(want.abs().max()))


@pytest.fixture
def lean_calls(monkeypatch):
    calls = []
    real = lean_mod.lean_forward

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(lean_mod, "lean_forward", spy)
    return calls


@pytest.mark.parametrize(
    "scale, bias, per_token_tau, entropy",
    [(1.0, False, False, False), (3.0, True, False, True), (2.0, False, True, True), (1.0, True, True, False)],
)
def test_lean_walk_matches_float64(scale, bias, per_token_tau, entropy, lean_calls, monkeypatch):
    monkeypatch.setenv("FASTRL_CHUNK_BYTES", str(4 * 300 * 8))  # 8-row chunks: several tiles, a ragged last one
    h, w, b, y, a = _case(scale=scale, bias=bias)
    tau = torch.linspace(0.5, 1.5, h.shape[0], dtype=torch.float64) if per_token_tau else 0.7
    logp, ent, (d_h, d_w, d_b) = _run(h, w, b, y, a, tau, entropy)
    assert lean_calls, "the float32 CPU call did not take the lean walk"
    t_logp, t_ent, t_dh, t_dw, t_db = _truth(h, w, b, y, a, tau)
    _close(logp, t_logp)
    _close(d_h, t_dh)
    _close(d_w, t_dw)
    if bias:
        _close(d_b, t_db)
    if entropy:
        _close(ent, t_ent, rtol=1e-4, atol=1e-5)
    else:
        assert ent is None


def test_targets_far_below_the_max_take_the_max_shift(lean_calls):
    # logits of a few hundred: exp(z − z_y) overflows for the unlikely targets, which the max shift redoes
    h, w, b, y, a = _case(scale=60.0, seed=3)
    logp, _, (d_h, d_w, _) = _run(h, w, b, y, a, 1.0)
    t_logp, _, t_dh, t_dw, _ = _truth(h, w, b, y, a, 1.0)
    assert lean_calls
    assert float(t_logp.min()) < -200, "the case must hold targets with p far below e^-69"
    assert torch.isfinite(logp).all() and torch.isfinite(d_h).all() and torch.isfinite(d_w).all()
    _close(logp, t_logp, rtol=1e-5, atol=1e-6)
    _close(d_h, t_dh)
    _close(d_w, t_dw)


def test_a_banned_target_has_logp_minus_inf_and_finite_gradients(lean_calls):
    h, w, b, y, a = _case(bias=True, seed=5)
    b[y[1]] = float("-inf")  # row 0 is masked (y[::7] = -100); row 1's target is banned
    logp, _, (d_h, d_w, d_b) = _run(h, w, b, y, a, 1.0)
    assert lean_calls
    banned = y == y[1]
    assert (logp[banned] == float("-inf")).all() and torch.isfinite(logp[~banned]).all()
    t_logp, _, t_dh, t_dw, t_db = _truth(h, w, b, y, a, 1.0)
    assert (t_logp[banned] == float("-inf")).all()
    _close(logp[~banned], t_logp[~banned])
    _close(d_h, t_dh)
    _close(d_w, t_dw)
    _close(d_b, t_db)


def test_an_entropy_gradient_takes_the_general_walk():
    params = FusedLossParams(impl="torch", entropy=True, needs=(True, True, False), entropy_grad=True)
    assert not lean_mod.lean_applies(torch.zeros(1, 2), torch.zeros(3, 2), params)
    metric = FusedLossParams(impl="torch", entropy=True, needs=(True, True, False), entropy_grad=False)
    assert lean_mod.lean_applies(torch.zeros(1, 2), torch.zeros(3, 2), metric)
    no_hidden_grad = FusedLossParams(impl="torch", entropy=True, needs=(False, True, False), entropy_grad=False)
    assert not lean_mod.lean_applies(torch.zeros(1, 2), torch.zeros(3, 2), no_hidden_grad)


def test_the_reference_agrees_with_the_truth_helper():
    # the float64 truth above is the package's own reference, so a slip in one of them shows here
    h, w, b, y, a = _case(bias=True)
    live = y >= 0
    ref, _ = token_logprobs_reference(h[live], w, y[live], b, LogprobParams())
    t_logp = _truth(h, w, b, y, a, 1.0)[0]
    torch.testing.assert_close(ref, t_logp[live], rtol=1e-12, atol=1e-12)
