"""`grpo_loss(..., batch_invariant=True)`: a sequence's d_hidden (and so its tokens' log-probs and entropies, which
it is formed from) are the same bits computed alone, beside 4,096 other tokens (64 for the Triton kernels under the
interpreter) and at another position, on the gradient-in-forward path (with and without the entropy) and on the
sampler's θ path, in both implementations (docs/math.md §1.2). The normalizer is fixed, so a token's loss weight
does not follow the batch either. The Triton gradient-in-forward case calls that pass's op with fixed per-token
upstream gradients (the policy kernels under the interpreter would take minutes).
"""

import pytest
import torch

from fastrl import GRPOLoss
from fastrl.kernels import LogprobRequest, fused_logprob_grads, logprob_call
from fastrl.kernels.fused_loss import api as fused_api
from fastrl.kernels.fused_loss.params import FusedLossParams

PROBE, T, V = 1, 64, 2100


def _case(b, d, seed=0, vocab=V):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(b, T)
    mask[:, T - 15 :] = 0  # 49 live tokens: 3 chunks of 16 and one of 1 alone (the plant below)
    return {
        "hidden": torch.randn(b, T, d, generator=gen),
        "weight": torch.randn(vocab, d, generator=gen) * 0.3,
        "targets": torch.randint(0, vocab, (b, T), generator=gen),
        "mask": mask,
        "advantages": torch.randn(b, generator=gen),
        "old_logprobs": torch.randn(b, T, generator=gen) * 0.1 - 7.5,
        "ref_logprobs": torch.randn(b, T, generator=gen) * 0.1 - 7.5,
    }


def _d_hidden(case, rows, impl, entropy_coef, sampler):
    loss = GRPOLoss(beta=0.04, entropy_coef=entropy_coef, impl=impl, batch_invariant=True)
    hidden = case["hidden"][rows].clone().requires_grad_()
    kw = {k: case[k][rows] for k in ("targets", "mask", "advantages", "old_logprobs", "ref_logprobs")}
    extra = dict(top_k=50, top_p=0.9) if sampler else {}
    out = loss(hidden, case["weight"], normalizer=1000.0, **kw, **extra)
    out.loss.backward()
    return hidden.grad[rows.index(PROBE)]


def _check(impl, entropy_coef, sampler, others, monkeypatch, chunk_rows=None):
    if chunk_rows is not None:  # the gradient-in-forward path's chunk (4 bytes per logit)
        monkeypatch.setenv("FASTRL_CHUNK_BYTES", str(4 * V * chunk_rows))
    b = others // T + 1
    case = _case(b, 32, vocab=V if impl == "torch" else 300)  # 300: interpreter time
    rest = [r for r in range(b) if r != PROBE]
    alone = _d_hidden(case, [PROBE], impl, entropy_coef, sampler)
    assert alone.abs().sum() > 0
    for rows in ([PROBE] + rest, rest[::-1] + [PROBE], rest[: b // 2] + [PROBE] + rest[b // 2 :]):
        assert torch.equal(_d_hidden(case, rows, impl, entropy_coef, sampler), alone)


CASES = [
    pytest.param("torch", 0.0, False, 4096, id="torch-fused-lean"),
    pytest.param("torch", 0.01, False, 4096, id="torch-fused-entropy"),
    pytest.param("torch", 0.01, True, 4096, id="torch-theta", marks=pytest.mark.slow),  # ~10 s
    pytest.param("triton", 0.01, True, 64, id="triton-theta"),
]


@pytest.mark.parametrize("impl, entropy_coef, sampler, others", CASES)
def test_a_sequences_d_hidden_does_not_depend_on_the_batch(impl, entropy_coef, sampler, others, monkeypatch,
                                                            rowwise_dot):  # fmt: skip
    _check(impl, entropy_coef, sampler, others, monkeypatch, 64 if impl == "triton" else None)  # interpreter time


def _fused_d_hidden(case, rows):
    # the Triton gradient-in-forward pass with upstream gradients fixed per token (by its place in the case)
    flat = torch.tensor(rows).unsqueeze(1) * T + torch.arange(T)  # [B, T] token ids of the case
    g, e = torch.sin(flat.float()).reshape(-1), torch.cos(flat.float()).reshape(-1)
    targets = torch.where(case["mask"][rows] > 0, case["targets"][rows], -100)
    hidden = case["hidden"][rows].requires_grad_()
    request = LogprobRequest(return_entropy=True, impl="triton", batch_invariant=True)
    call, _ = logprob_call(hidden, case["weight"], targets, request)
    _, _, (d_hidden, _, _) = fused_logprob_grads(call, lambda idx, logp, ent: (g[idx], e[idx]), entropy_grad=True)
    return d_hidden.reshape(hidden.shape)[rows.index(PROBE)]


@pytest.mark.slow  # ~10 s: outside the edit loop, run in CI
def test_triton_fused_pass_d_hidden_does_not_depend_on_the_batch(monkeypatch):
    monkeypatch.setenv("FASTRL_CHUNK_BYTES", str(4 * 300 * 32))  # 32-token chunks (interpreter time)
    case = _case(2, 32, vocab=300)
    alone = _fused_d_hidden(case, [PROBE])
    assert alone.abs().sum() > 0
    for rows in ([PROBE, 0], [0, PROBE]):
        assert torch.equal(_fused_d_hidden(case, rows), alone)


@pytest.mark.slow  # ~10 s: outside the edit loop, run in CI
def test_planted_unpadded_fused_chunks_fail(monkeypatch):
    # the gradient-in-forward chunks without their padding: the last chunk's GEMMs take its token count again (the
    # probe alone ends with a 1-token chunk)
    monkeypatch.setattr(fused_api, "FusedLossParams", lambda *a: FusedLossParams(*a[:4], False))
    with pytest.raises(AssertionError):
        _check("torch", 0.01, False, 4096, monkeypatch, chunk_rows=16)


def test_batch_invariant_must_be_a_bool():
    with pytest.raises(TypeError, match="batch_invariant"):
        GRPOLoss(batch_invariant=1)
