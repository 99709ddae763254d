"""The kept-set (CSR) contract of the replay path, each point (docs/math.md §9), and `kept_set_from_vllm`."""

import types

import pytest
import torch
from replay_case import IGNORE, make_case, oracle, replayed, run

from fastrl.kernels.logprobs.kept_set import kept_set_from_vllm


@pytest.fixture(scope="module")
def case():
    return make_case(n=9, d=8, v=11, k=4, full_rows=(4,), ignored=(2,))


def _call(case, ids=None, offsets=None, targets=None, **kw):
    ids = case["kept_ids"] if ids is None else ids
    offsets = case["kept_offsets"] if offsets is None else offsets
    targets = case["targets"] if targets is None else targets
    return replayed(case["hidden"], case["weight"], targets, ids, offsets, ignore_index=IGNORE, **kw)


def _row_start(case, row):
    return int(case["kept_offsets"][row])


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_ids_int32_or_int64_and_unsorted_sets(case, dtype):
    base = _call(case).logp
    got = _call(case, ids=case["kept_ids"].to(dtype), offsets=case["kept_offsets"].to(dtype)).logp
    assert torch.equal(got, base)
    # reverse every set: the same sets in another order
    rev = torch.cat([torch.tensor(s[::-1], dtype=torch.int64) for s in case["sets"]])
    torch.testing.assert_close(_call(case, ids=rev).logp, base, rtol=0, atol=2e-6)


@pytest.mark.parametrize(
    "ids, offsets, err, match",
    [
        (lambda c: c["kept_ids"].float(), None, TypeError, "kept_ids must be int32 or int64, got dtype torch.float32"),
        (lambda c: c["kept_ids"].reshape(1, -1), None, ValueError, r"kept_ids must be 1-D"),
        (None, lambda c: c["kept_offsets"][:-1], ValueError, r"kept_offsets must be \[N \+ 1\] = \[10\]"),
        (None, lambda c: c["kept_offsets"].to(torch.int16), TypeError, "kept_offsets must be int32 or int64"),
        (None, lambda c: c["kept_offsets"] + 1, ValueError, r"kept_offsets\[0\] must be 0, got 1"),
        (None, lambda c: torch.cat([c["kept_offsets"][:-1], c["kept_offsets"][-1:] - 1]), ValueError,
         r"kept_offsets\[-1\] must equal len\(kept_ids\)"),
    ],
    ids=["float-ids", "2d-ids", "short-offsets", "int16-offsets", "offsets0", "offsets-last"],
)  # fmt: skip
def test_csr_shape_and_dtype_errors(case, ids, offsets, err, match):
    with pytest.raises(err, match=match):
        _call(case, ids=ids(case) if ids else None, offsets=offsets(case) if offsets else None)


def test_non_monotone_offsets_name_the_row(case):
    off = case["kept_offsets"].clone()
    off[6] = off[7] + 1  # row 6's segment runs backwards
    with pytest.raises(ValueError, match="non-decreasing: row 6"):
        _call(case, offsets=off)


@pytest.mark.parametrize("bad_id", [11, -1])
def test_out_of_range_id_names_the_row(case, bad_id):
    ids = case["kept_ids"].clone()
    ids[_row_start(case, 5)] = bad_id
    with pytest.raises(ValueError, match=f"row 5's kept set holds token id {bad_id}, outside"):
        _call(case, ids=ids)


def test_duplicate_id_names_the_row(case):
    ids = case["kept_ids"].clone()
    start = _row_start(case, 4)  # the full-vocab row
    ids[start + 1] = ids[start]
    with pytest.raises(ValueError, match=f"row 4's kept set holds token id {int(ids[start])} twice"):
        _call(case, ids=ids)


def test_ignored_row_with_a_set_and_live_row_without_one(case):
    targets = case["targets"].clone()
    targets[3] = IGNORE
    with pytest.raises(ValueError, match="row 3 is ignored .* its kept set is not empty"):
        _call(case, targets=targets)
    targets = case["targets"].clone()
    targets[2] = 0  # row 2 was ignored: its set is empty
    with pytest.raises(ValueError, match="row 2 is live but its kept set is empty"):
        _call(case, targets=targets)


def test_target_outside_its_set_raises_or_is_masked(case):
    sets = [list(s) for s in case["sets"]]
    y = int(case["targets"][6])
    sets[6].remove(y) if len(sets[6]) > 1 else sets[6].__setitem__(0, (y + 1) % 11)
    ids = torch.tensor([x for s in sets for x in s])
    offsets = torch.tensor([0] + [len(s) for s in sets]).cumsum(0)
    with pytest.raises(ValueError, match=f"row 6's target {y} is not in its kept set"):
        _call(case, ids=ids, offsets=offsets)
    moved = dict(case, kept_ids=ids, kept_offsets=offsets)
    want = oracle(moved)  # logp = z_y − log Σ_S exp z, finite; its gradient has the target's one-hot term
    for impl in ("torch", "triton"):
        out = _call(moved, impl=impl, on_missing="mask")
        assert out.missing.tolist() == [i == 6 for i in range(9)]
        got = run(moved, impl, on_missing="mask")
        for a, b in zip(got[:4], want[:4]):  # no bias here
            torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-6)


def test_a_set_of_the_whole_vocabulary_is_the_plain_log_prob():
    from fastrl import token_logprobs

    case = make_case(n=6, d=8, v=11, full_rows=range(6), ignored=())
    got = _call(case, temperature=0.8)
    plain, entropy = token_logprobs(
        case["hidden"], case["weight"], case["targets"], temperature=0.8, return_entropy=True
    )
    torch.testing.assert_close(got.logp, plain, rtol=0, atol=2e-6)
    torch.testing.assert_close(got.entropy, entropy, rtol=0, atol=2e-6)


def test_return_topk_is_the_top_of_the_set(case):
    for impl in ("torch", "triton"):
        out = _call(case, impl=impl, return_topk=3, softcap=2.0)
        z = torch.tanh(case["hidden"].double() @ case["weight"].double().T / 2.0) * 2.0
        for i, s in enumerate(case["sets"]):
            want = sorted(s, key=lambda v: -float(z[i, v]))[:3]
            assert out.topk_ids[i, : len(want)].tolist() == want, i
            assert (
                out.topk_ids[i, len(want) :].eq(-1).all() and out.topk_logprobs[i, len(want) :].eq(-float("inf")).all()
            )
            if want:
                lse = torch.logsumexp(z[i, s], 0)
                torch.testing.assert_close(
                    out.topk_logprobs[i, : len(want)].double(), z[i, want] - lse, rtol=0, atol=2e-6
                )


def test_kept_set_from_vllm_flattens_completions_with_empty_padding_rows():
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 0]], dtype=torch.bool)  # a left-padded second completion
    masks = [types.SimpleNamespace(token_ids=[[5, 2], [7], [1, 3, 0]]), types.SimpleNamespace(token_ids=[[4], [9, 8]])]
    ids, offsets = kept_set_from_vllm(masks, mask)
    assert ids.dtype == torch.int32 and offsets.dtype == torch.int64
    assert ids.tolist() == [5, 2, 7, 1, 3, 0, 4, 9, 8]
    assert offsets.tolist() == [0, 2, 3, 6, 6, 6, 7, 9, 9]
    with pytest.raises(ValueError, match="completion 1: its sampling mask has 2 kept sets but completion_mask marks 3"):
        kept_set_from_vllm(masks, torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]]))
    with pytest.raises(ValueError, match="got 1 sampling masks for a completion_mask of 2 rows"):
        kept_set_from_vllm(masks[:1], mask)
    with pytest.raises(TypeError, match="sampling mask 0 has no token_ids"):
        kept_set_from_vllm([None, masks[1]], mask)


def test_kept_set_from_vllm_feeds_the_replay_call():
    case = make_case(n=8, d=8, v=11, k=4, full_rows=(), ignored=(3, 7))
    completion = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.bool)
    per_row = case["sets"]
    masks = [types.SimpleNamespace(token_ids=[per_row[i] for i in range(4 * b, 4 * b + 3)]) for b in range(2)]
    ids, offsets = kept_set_from_vllm(masks, completion)
    assert torch.equal(ids.long(), case["kept_ids"].long()) and torch.equal(offsets, case["kept_offsets"])
    got = replayed(case["hidden"], case["weight"], case["targets"], ids, offsets, ignore_index=IGNORE)
    torch.testing.assert_close(got.logp.double(), oracle(case)[0], rtol=0, atol=2e-6)
