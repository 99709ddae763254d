"""`batch_invariant=True`: a row's log-prob, entropy, top-k export and d_hidden are the same bits computed alone, in
a batch of 4,096 other rows (130 for the Triton kernels: the interpreter runs programs one at a time) and at another
position, on the plain path and the θ path (top-k + top-p, per-token temperature), in both implementations
(docs/math.md §1.2). The last call also patches the SM count to an H100's (132) and asks for autotuning, which an
invariant call must ignore. The θ path's threshold is found on the Triton forward's own logits.

The Triton cases run the interpreter's dot row by row (the `rowwise_dot` fixture: numpy's sgemm, unlike a GPU's MMA
tile, sums a row by its place in the tile); what they test is everything around the tile (splits, merge, chunk
widths, GEMMs).
"""

import dataclasses
import inspect

import pytest
import torch

from fastrl import token_logprobs
from fastrl.kernels import configs
from fastrl.kernels.fused_loss import epilogue
from fastrl.kernels.logprobs import api, bwd, fwd, kernel_logits, sampled
from fastrl.kernels.logprobs.params import LogprobParams

IGNORE, PROBE, V = -100, 5, 2100  # V: 17 vocab tiles of 128, so the Triton forward has 16 splits


def _case(n, d, vocab, seed=0):
    gen = torch.Generator().manual_seed(seed)
    case = {
        "hidden": torch.randn(n, d, generator=gen),
        "weight": torch.randn(vocab, d, generator=gen) * 0.3,
        "bias": torch.randn(vocab, generator=gen) * 0.1,
        "targets": torch.randint(0, vocab, (n,), generator=gen),
        "tau": torch.rand(n, generator=gen) + 0.5,
        "g": torch.randn(n, generator=gen),
        "e": torch.randn(n, generator=gen),
    }
    case["targets"][1::7] = IGNORE
    return case


def _probe(case, rows, impl, sampler):
    """Row PROBE's (logp, entropy, d_hidden[, top-k ids, top-k logprobs]) when the call holds `rows`."""
    at = rows.index(PROBE)
    hidden = case["hidden"][rows].clone().requires_grad_()
    kw = dict(top_k=50, top_p=0.9, return_topk=3, temperature=case["tau"][rows]) if sampler else {"temperature": 0.9}
    logp, entropy, *top = token_logprobs(
        hidden, case["weight"], case["targets"][rows], bias=case["bias"], return_entropy=True, impl=impl,
        ignore_index=IGNORE, batch_invariant=True, **kw,
    )  # fmt: skip
    (logp * case["g"][rows] + entropy * case["e"][rows]).sum().backward()
    return (logp[at], entropy[at], hidden.grad[at], *(t[at] for t in top))


def _check_invariance(impl, sampler, monkeypatch, others, d, autotune=True):
    if impl == "triton":
        monkeypatch.setenv("FASTRL_CHUNK_BYTES", str(24 * V * 128))  # θ-search blocks of 128 rows (interpreter time)
    case = _case(others + 1, d, V if impl == "triton" else 1000)  # the torch walks have no splits to show
    rest = [r for r in range(others + 1) if r != PROBE]
    alone = _probe(case, [PROBE], impl, sampler)
    first = _probe(case, [PROBE] + rest, impl, sampler)
    last = _probe(case, rest[::-1] + [PROBE], impl, sampler)
    monkeypatch.setattr(configs, "sm_count", lambda device: 132)
    if autotune:
        monkeypatch.setenv("FASTRL_AUTOTUNE", "1")
        monkeypatch.setattr(configs, "autotune_enabled", lambda device: True)
    middle = _probe(case, rest[: others // 2] + [PROBE] + rest[others // 2 :], impl, sampler)
    assert alone[2].abs().sum() > 0
    for got in (first, last, middle):
        for a, b in zip(got, alone):
            assert torch.equal(a, b)


CASES = [
    pytest.param("torch", False, 4096, 32, id="torch-plain"),
    pytest.param("torch", True, 4096, 32, id="torch-theta", marks=pytest.mark.slow),  # ~6 s
    pytest.param("triton", False, 130, 32, id="triton-plain"),
    pytest.param("triton", True, 130, 32, id="triton-theta"),
]


@pytest.mark.parametrize("impl, sampler, others, d", CASES)
def test_a_rows_outputs_do_not_depend_on_the_batch(impl, sampler, others, d, monkeypatch, rowwise_dot):
    _check_invariance(impl, sampler, monkeypatch, others, d)


def test_planted_torch_chunks_that_follow_n_fail(monkeypatch):
    # the torch walks without their fixed blocks: the chunk rows (the GEMMs' M) follow the token count again
    monkeypatch.setattr(api, "_in_blocks", lambda call: api._PATHS[api.route(call), call.impl](call))
    with pytest.raises(AssertionError):
        _check_invariance("torch", False, monkeypatch, 4096, 32)


@pytest.mark.slow  # ~5-10 s of interpreted kernels: outside the edit loop, run in CI
def test_planted_triton_splits_that_follow_the_sm_count_fail(monkeypatch, rowwise_dot):
    # the forward's vocab split chosen by N and the SM count again, as without batch_invariant
    partials = fwd.logprob_partials

    def planted(hidden, weight, targets, bias, params, **kw):
        return partials(hidden, weight, targets, bias, dataclasses.replace(params, batch_invariant=False), **kw)

    monkeypatch.setattr(fwd, "logprob_partials", planted)
    with pytest.raises(AssertionError):
        _check_invariance("triton", False, monkeypatch, 130, 32, autotune=False)


def test_invariant_kernels_use_no_atomics_and_never_tune(monkeypatch):
    for module in (fwd, bwd, kernel_logits, epilogue):
        assert "tl.atomic_" not in inspect.getsource(module), f"{module.__name__} uses a Triton atomic"
    monkeypatch.setattr(configs, "autotune_enabled", lambda device: True)
    cpu = torch.device("cpu")
    for name, kernel in (("logprob_fwd", fwd.logprob_fwd_kernel), ("logprob_dz_sampled", bwd.logprob_dz_kernel)):
        fn, kwargs = configs.kernel_and_kwargs(name, kernel, cpu, tune=False)
        assert fn is kernel and kwargs["BLOCK_V"] == configs.default_config(name, cpu).kwargs["BLOCK_V"]
    assert configs.kernel_and_kwargs("logprob_fwd", fwd.logprob_fwd_kernel, cpu)[0] is not fwd.logprob_fwd_kernel


def _kernel_topk_logp(hidden, weight, targets, k):
    # the oracle of the Triton θ path: the k largest of the forward kernel's own logits
    z = kernel_logits.kernel_logits(hidden, weight, None, LogprobParams()).double()
    top = z.topk(k, dim=1).values
    return z.gather(1, targets.unsqueeze(1)).squeeze(1) - top.logsumexp(1)


@pytest.mark.slow  # ~5-10 s of interpreted kernels: outside the edit loop, run in CI
def test_triton_theta_comes_from_the_kernels_logits():
    # bf16 inputs: torch's logits, rounded to bf16, tie at the top-k cutoff where the kernel's float32 ones do not.
    # A θ from those would keep the whole tie in the kernel's set; θ from the kernel's logits keeps exactly k.
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(16, 64, generator=gen).bfloat16()
    weight = (torch.randn(V, 64, generator=gen) * 0.4).bfloat16()
    targets = torch.randint(0, V, (16,), generator=gen)
    k = 40
    z = kernel_logits.kernel_logits(hidden, weight, None, LogprobParams())
    targets = torch.where(z.gather(1, targets.unsqueeze(1)).squeeze(1) >= z.topk(k, dim=1).values[:, -1],
                          targets, z.argmax(1))  # fmt: skip
    logp = token_logprobs(hidden, weight, targets, top_k=k, impl="triton")
    torch.testing.assert_close(logp.double(), _kernel_topk_logp(hidden, weight, targets, k), rtol=0, atol=1e-5)


@pytest.mark.slow  # ~5-10 s of interpreted kernels: outside the edit loop, run in CI
def test_planted_theta_from_torch_logits_fails(monkeypatch):
    monkeypatch.setattr(sampled, "_kernel_tile", sampled._torch_tile)
    with pytest.raises(AssertionError):
        test_triton_theta_comes_from_the_kernels_logits()
