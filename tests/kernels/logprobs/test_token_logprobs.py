"""token_logprobs (both impls) against a float64 ground truth and the eager reference in the same dtype.

The kernel's error on every output and every gradient must be no worse than eager PyTorch's in the
same dtype plus a small per-dtype tolerance (errors are max-abs, relative to the ground truth's scale).
Kernel outputs are poisoned with NaN before launch (FASTRL_POISON=1), so an unwritten element fails.
"""

import pytest
import torch

import fastrl
from fastrl.kernels import LogprobParams, configs, token_logprobs_reference
from fastrl.kernels.logprobs import fwd
from fastrl.kernels.logprobs.fwd import logprob_forward

IMPLS = ("torch", "triton")
# About one unit in the last place of each dtype, relative to the scale of the value compared.
TOL = {torch.float32: 1e-5, torch.float16: 5e-4, torch.bfloat16: 4e-3}
DTYPE_NAME = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("FASTRL_POISON", "1")


def make_inputs(lead, d, v, dtype, with_bias, ignore_frac=0.15, strided=False):
    hidden = torch.randn(*lead, d + (8 if strided else 0))
    if strided:
        hidden = hidden[..., 3 : 3 + d]  # a non-contiguous view: the kernels must use the strides
    # logits of std ~2, so softmax is neither flat nor one-hot
    weight = torch.randn(v, d) * (2.0 / d**0.5)
    bias = torch.randn(v) * 0.5 if with_bias else None
    targets = torch.randint(0, v, lead)
    targets[torch.rand(lead) < ignore_frac] = -100
    cast = [t.to(dtype) if t is not None else None for t in (hidden, weight, bias)]
    return (*cast, targets)


def run(impl, hidden, weight, bias, targets, temperature, entropy, g, e, use_ref=False):
    """Forward + backward with upstream (g, e); returns {name: tensor} of outputs and gradients."""
    leaves = [t.detach().requires_grad_() if t is not None else None for t in (hidden, weight, bias)]
    h, w, b = leaves
    if use_ref:
        params = LogprobParams(temperature, -100, entropy)
        d = h.shape[-1]
        logp, ent = token_logprobs_reference(h.reshape(-1, d), w, targets.reshape(-1), b, params)
        logp = logp.reshape(targets.shape)
        ent = ent.reshape(targets.shape) if entropy else None
    else:
        out = fastrl.token_logprobs(h, w, targets, bias=b, temperature=temperature, return_entropy=entropy, impl=impl)
        logp, ent = out if entropy else (out, None)
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


CASES = [
    # lead dims, D, V, dtype, bias, temperature, entropy
    ((77,), 120, 1001, torch.float32, True, 0.7, True),
    ((77,), 120, 1001, torch.bfloat16, True, 0.7, True),
    ((77,), 120, 1001, torch.float32, False, 1.0, False),
    ((3, 29), 120, 1001, torch.bfloat16, False, 1.0, True),
    ((3, 29), 64, 517, torch.float16, True, 1.3, True),
    ((5,), 40, 300, torch.bfloat16, True, 0.7, False),
]


def case_id(c):
    lead, d, v, dtype, bias, temp, ent = c
    n = "x".join(map(str, lead))
    return f"N{n}-D{d}-V{v}-{DTYPE_NAME[dtype]}" + ("-bias" if bias else "") + f"-t{temp}" + ("-ent" if ent else "")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_matches_float64_no_worse_than_eager(impl, case):
    lead, d, v, dtype, with_bias, temperature, entropy = case
    hidden, weight, bias, targets = make_inputs(lead, d, v, dtype, with_bias, strided=len(lead) == 1)
    g, e = torch.randn(lead), torch.randn(lead)
    up = lambda t: None if t is None else t.double()  # noqa: E731
    truth = run(None, up(hidden), up(weight), up(bias), targets, temperature, entropy, g, e, use_ref=True)
    eager = run(None, hidden, weight, bias, targets, temperature, entropy, g, e, use_ref=True)
    got = run(impl, hidden, weight, bias, targets, temperature, entropy, g, e)

    assert got.keys() == truth.keys()
    ignored = targets == -100
    assert (got["logp"][ignored] == 0).all()
    assert got["logp"].dtype == torch.float32 and got["d_hidden"].dtype == dtype
    for name, ref in truth.items():
        assert torch.isfinite(got[name]).all(), name
        assert got[name].shape == ref.shape, name
        err, err_eager = rel_err(got[name], ref), rel_err(eager[name], ref)
        assert err <= err_eager + TOL[dtype], f"{name}: {impl} err {err:.2e} vs eager {err_eager:.2e}"
    assert (got["d_hidden"][ignored] == 0).all()


@pytest.mark.parametrize("entropy", [True, False], ids=["ent", "logp-only"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_NAME.get)
def test_torch_path_in_small_chunks(monkeypatch, dtype, entropy):
    # A 20 kB budget: the forward walks 16-row token chunks, the backward 64-column vocab chunks, so
    # targets, ignored rows and the fp32 d_hidden sum all cross chunk borders.
    monkeypatch.setenv("FASTRL_CHUNK_BYTES", "20000")
    hidden, weight, bias, targets = make_inputs((77,), 120, 1001, dtype, True)
    g, e = torch.randn(77), torch.randn(77)
    up = lambda t: t.double()  # noqa: E731
    truth = run(None, up(hidden), up(weight), up(bias), targets, 0.7, entropy, g, e, use_ref=True)
    eager = run(None, hidden, weight, bias, targets, 0.7, entropy, g, e, use_ref=True)
    got = run("torch", hidden, weight, bias, targets, 0.7, entropy, g, e)
    assert got.keys() == truth.keys()
    for name, ref in truth.items():
        err, err_eager = rel_err(got[name], ref), rel_err(eager[name], ref)
        assert err <= err_eager + TOL[dtype], f"{name}: err {err:.2e} vs eager {err_eager:.2e}"


@pytest.mark.parametrize("scale", [8.0, 30.0], ids=lambda s: f"logit-std{s:g}")
@pytest.mark.parametrize("impl", IMPLS)
def test_peaked_softmax_gradients(monkeypatch, impl, scale):
    # Most targets are each row's most likely token (p near 1): the chunked float32 backward forms the
    # one-hot and softmax parts of ∂W and ∂h as two GEMM sums that nearly cancel, which must cost no
    # more precision than eager's elementwise onehot − p. Small chunks: the cancellation crosses slabs.
    monkeypatch.setenv("FASTRL_CHUNK_BYTES", "20000")
    g_ = torch.Generator().manual_seed(11)
    hidden = torch.randn(64, 32, generator=g_)
    weight = torch.randn(500, 32, generator=g_) * (scale / 32**0.5)
    bias = torch.randn(500, generator=g_)
    targets = (hidden @ weight.T + bias).argmax(-1)
    targets[::7] = torch.randint(0, 500, targets[::7].shape, generator=g_)
    targets[::9] = -100
    g, e = torch.randn(64, generator=g_), torch.randn(64, generator=g_)
    up = lambda t: t.double()  # noqa: E731
    truth = run(None, up(hidden), up(weight), up(bias), targets, 0.9, False, g, e, use_ref=True)
    eager = run(None, hidden, weight, bias, targets, 0.9, False, g, e, use_ref=True)
    got = run(impl, hidden, weight, bias, targets, 0.9, False, g, e)
    for name, ref in truth.items():
        err, err_eager = rel_err(got[name], ref), rel_err(eager[name], ref)
        assert err <= err_eager + TOL[torch.float32], f"{name}: err {err:.2e} vs eager {err_eager:.2e}"


@pytest.mark.parametrize("n_splits", [1, 3, 8, 11], ids=lambda s: f"splits{s}")
def test_forward_vocab_splits_merge(n_splits, monkeypatch):
    # V=1001 is 8 tiles of 128: 11 splits leaves three of them empty, which the merge must ignore.
    hidden, weight, bias, targets = make_inputs((77,), 120, 1001, torch.float32, True)
    params = LogprobParams(0.7, -100, True)
    chosen = []
    monkeypatch.setattr(fwd, "_choose_splits", lambda *args: chosen.append(n_splits) or n_splits)
    logp, lse, ent = logprob_forward(hidden, weight, targets, bias, params)
    assert chosen == [n_splits]
    ref_logp, ref_ent = token_logprobs_reference(hidden.double(), weight.double(), targets, bias.double(), params)
    assert rel_err(logp, ref_logp) < 1e-6 and rel_err(ent, ref_ent) < 1e-6
    z = (hidden.double() @ weight.double().T + bias.double()) / 0.7
    assert rel_err(lse, torch.logsumexp(z, -1)) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_NAME.get)
def test_backward_in_vocab_chunks(monkeypatch, dtype):
    # A tiny slab budget walks V=1001 in 256-column chunks: d_hidden accumulates across chunks in fp32.
    monkeypatch.setattr(configs, "BWD_SLAB_BYTES", 1)
    shapes = []
    alloc = configs.alloc
    monkeypatch.setattr(configs, "alloc", lambda shape, *a: shapes.append(tuple(shape)) or alloc(shape, *a))
    hidden, weight, bias, targets = make_inputs((77,), 120, 1001, dtype, True)
    g, e = torch.randn(77), torch.randn(77)
    up = lambda t: t.double()  # noqa: E731
    truth = run(None, up(hidden), up(weight), up(bias), targets, 0.7, True, g, e, use_ref=True)
    eager = run(None, hidden, weight, bias, targets, 0.7, True, g, e, use_ref=True)
    got = run("triton", hidden, weight, bias, targets, 0.7, True, g, e)
    for name, ref in truth.items():
        err, err_eager = rel_err(got[name], ref), rel_err(eager[name], ref)
        assert err <= err_eager + TOL[dtype], f"{name}: err {err:.2e} vs eager {err_eager:.2e}"
    # kernel buffers: O(N · splits) forward partials and one [N, 256] backward slab, never [N, V]
    assert (77, 256) in shapes and max(s[-1] for s in shapes) <= 256, shapes


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("which", ["logp-only", "entropy-only"])
def test_gradient_through_one_output(impl, which):
    hidden, weight, _, targets = make_inputs((33,), 48, 400, torch.float32, False)
    grads = []
    for use_impl in (impl, None):
        h = hidden.detach().requires_grad_()
        if use_impl is None:
            logp, ent = token_logprobs_reference(
                h.double(), weight.double(), targets, None, LogprobParams(1.0, -100, True)
            )
        else:
            logp, ent = fastrl.token_logprobs(h, weight, targets, return_entropy=True, impl=use_impl)
        (logp if which == "logp-only" else ent).sum().backward()
        grads.append(h.grad)
    assert rel_err(grads[0], grads[1]) < 1e-5


@pytest.mark.parametrize("impl", IMPLS)
def test_no_grad_call_saves_nothing(impl):
    hidden, weight, _, targets = make_inputs((20,), 32, 300, torch.float32, False)
    hidden.requires_grad_()
    with torch.no_grad():
        logp, ent = fastrl.token_logprobs(hidden, weight, targets, return_entropy=True, impl=impl)
    assert logp.grad_fn is None and ent.grad_fn is None
    logp = fastrl.token_logprobs(hidden.detach(), weight, targets, impl=impl)
    assert logp.grad_fn is None and not logp.requires_grad


def test_all_ignored_and_single_token():
    hidden, weight, _, _ = make_inputs((3,), 16, 130, torch.float32, False)
    targets = torch.full((3,), -100)
    hidden.requires_grad_()
    logp, ent = fastrl.token_logprobs(hidden, weight, targets, return_entropy=True, impl="triton")
    (logp.sum() + ent.sum()).backward()
    assert (logp == 0).all() and (ent == 0).all() and (hidden.grad == 0).all()
    one = fastrl.token_logprobs(hidden[:1].detach(), weight, torch.tensor([5]), impl="triton")
    ref, _ = token_logprobs_reference(hidden[:1].detach(), weight, torch.tensor([5]))
    assert torch.allclose(one, ref, atol=1e-5)


@pytest.mark.parametrize("kernel", sorted(configs.DEFAULT_CONFIGS))
def test_configs_fit_their_kernel(kernel):
    # Autotuning only runs on a GPU; here check that its keys and every config name real kernel params.
    from fastrl.kernels.logprobs.bwd import logprob_dz_kernel
    from fastrl.kernels.logprobs.fwd import logprob_fwd_kernel

    fn = (logprob_fwd_kernel if kernel.startswith("logprob_fwd") else logprob_dz_kernel).fn
    assert set(configs.AUTOTUNE_KEYS[kernel]) <= set(fn.arg_names)
    for arch in (80, 90):
        for cfg in configs.shipped_configs(kernel, arch):
            assert set(cfg.kwargs) <= set(fn.arg_names), cfg
    assert configs.token_bucket(3000) == configs.token_bucket(4096) == 4096
