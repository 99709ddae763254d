"""The replay path (docs/math.md §9) against a float64 oracle: materialized logits with the kept sets as a mask.

logp, the entropy of the kept distribution and every gradient (hidden, weight, bias), both implementations (the
Triton kernels under the interpreter), on random sets of uneven sizes (1..9 ids, one row holding the whole
vocabulary, two ignored rows), scalar and per-token temperature, bias, soft-cap, and a float32 head with
bfloat16 hidden states. Planted bugs (a kept token dropped from the denominator, d_weight sent to the wrong
row) must fail the same comparison.
"""

import pytest
import torch
from replay_case import make_case, oracle, run

from fastrl.kernels.logprobs import replay_bwd, replay_torch

NAMES = ("logp", "entropy", "d_hidden", "d_weight", "d_bias")
CASES = {
    "fp32": dict(case=dict(), call=dict()),
    "fp32-tau0.7-bias": dict(case=dict(bias=True), call=dict(temperature=0.7)),
    "fp32-tau-per-token-bias-softcap": dict(case=dict(bias=True), call=dict(softcap=2.5, per_token=True)),
    "bf16-bias-softcap": dict(case=dict(dtype=torch.bfloat16, bias=True), call=dict(softcap=3.0)),
    "bf16-f32head-bias-softcap-tau1.3": dict(
        case=dict(dtype=torch.bfloat16, head=torch.float32, bias=True), call=dict(softcap=3.0, temperature=1.3)
    ),
}
# Relative error bound (max |got − want| / max |want|) per output: float32 arithmetic everywhere; a gradient comes
# back in its input's dtype (bfloat16: 2⁻⁸ rounding).
TOL = {torch.float32: 2e-6, torch.bfloat16: 8e-3}


def _call_kwargs(case, call):
    call = dict(call)
    if call.pop("per_token", False):
        n = case["targets"].shape[0]
        call["temperature"] = torch.rand(n, generator=torch.Generator().manual_seed(5)) + 0.4
    return call


def _rel(got, want):
    return float((got.detach().double() - want).abs().max() / want.abs().max().clamp(min=1e-30))


def check_against_oracle(case, impl, call):
    got = run(case, impl, **call)
    want = oracle(case, **call)
    for name, a, b in zip(NAMES, got, want):
        if b is None:
            assert a is None, name
            continue
        tol = TOL[a.dtype]
        assert torch.isfinite(a).all(), name
        assert _rel(a, b) <= tol, f"{name}: relative error {_rel(a, b):.3g} > {tol}"


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("name", list(CASES))
def test_replay_matches_float64_oracle(name, impl):
    case = make_case(**CASES[name]["case"])
    check_against_oracle(case, impl, _call_kwargs(case, CASES[name]["call"]))


def test_ignored_rows_get_zero_and_never_read_their_hidden_state():
    case = make_case(bias=True)
    case["hidden"][[2, 11]] = float("nan")  # padding rows may hold anything
    for impl in ("torch", "triton"):
        logp, entropy, d_hidden, d_weight, d_bias = run(case, impl)
        assert logp[[2, 11]].eq(0).all() and entropy[[2, 11]].eq(0).all()
        assert d_hidden[[2, 11]].eq(0).all()
        assert all(torch.isfinite(x).all() for x in (logp, entropy, d_hidden, d_weight, d_bias))


def _drop_last_kept(orig):
    def planted(z, rows, n):
        z = z.clone()
        last = torch.ones_like(rows, dtype=torch.bool)
        last[:-1] = rows[1:] != rows[:-1]
        first = torch.ones_like(last)
        first[1:] = rows[1:] != rows[:-1]
        z[last & ~first] = float("-inf")  # the last id of every set of two or more leaves the denominator
        return orig(z, rows, n)

    return planted


def test_planted_dropped_denominator_token_fails(monkeypatch):
    monkeypatch.setattr(replay_torch, "row_stats", _drop_last_kept(replay_torch.row_stats))
    with pytest.raises(AssertionError, match="logp"):
        check_against_oracle(make_case(), "torch", {})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_planted_d_weight_on_the_wrong_row_fails_torch(monkeypatch, dtype):
    case = make_case(dtype=dtype, head=torch.float32)
    orig = replay_torch.token_offsets

    def planted(sorted_ids, vocab):  # token v's bag holds token v − 1's pairs
        off = orig(sorted_ids, vocab)
        return torch.cat([off[:1], off[:-2], off[-1:]])

    monkeypatch.setattr(replay_torch, "token_offsets", planted)
    with pytest.raises(AssertionError, match="d_weight"):
        check_against_oracle(case, "torch", {})


def test_planted_d_weight_on_the_wrong_row_fails_triton(monkeypatch):
    case = make_case()
    vocab = case["weight"].shape[0]
    orig = replay_bwd.id_segments

    def planted(sorted_ids):
        ids, starts = orig(sorted_ids)
        return (ids + 1) % vocab, starts

    monkeypatch.setattr(replay_bwd, "id_segments", planted)
    with pytest.raises(AssertionError, match="d_weight"):
        check_against_oracle(case, "triton", {})
