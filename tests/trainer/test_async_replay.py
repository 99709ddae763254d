"""Replay under async training without an engine: the kept sets a rollout group carries (NumPy arrays, pieces
concatenated in order) reach the samples and the micro-batch's CSR unchanged."""

import pickle

import numpy as np
import pytest

from fastrl.trainer.async_source import completions_of
from fastrl.trainer.batching import Sample, collate
from fastrl.trainer.rollout.async_worker import _joined
from fastrl.trainer.staleness import RolloutGroup, VersionSpan


def arrays(sets: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.array([i for s in sets for i in s], dtype=np.int32)
    return ids, np.array([len(s) for s in sets], dtype=np.int32)


# two completions of prompt [1, 2]: the first sampled in two pieces (2 tokens, then 1), the second in one
PIECES = [[[[4, 5, 9], [5]], [[6, 7]]], [[[3, 8], [8, 9, 10], [4]]]]
TOKENS = [[5, 5, 7], [8, 9, 4]]


def group() -> RolloutGroup:
    kept = [_joined([arrays(p) for p in pieces]) for pieces in PIECES]
    spans = [(VersionSpan(0, 0, 3),)] * 2
    return RolloutGroup(3, [1, 2], TOKENS, [[-0.5] * 3] * 2, spans, [True, True], kept=kept)


def test_pieces_reach_the_micro_batch_csr_in_order():
    g = pickle.loads(pickle.dumps(group()))  # what crosses the queue
    comps = completions_of([g])
    want = [[s for piece in pieces for s in piece] for pieces in PIECES]
    for c, sets in zip(comps, want):
        assert c.kept.counts.tolist() == [len(s) for s in sets]
        assert c.kept.ids.tolist() == [i for s in sets for i in s]
    samples = [Sample(c.prompt_ids, c.completion_ids, 1.0, kept=c.kept) for c in comps]
    mb = collate(samples, packed=False, pad_id=0)
    offsets = mb["kept_offsets"].tolist()
    tc = mb["targets"].shape[1]
    for row, sets in enumerate(want):
        for t, s in enumerate(sets):
            start, end = offsets[row * tc + t], offsets[row * tc + t + 1]
            assert mb["kept_ids"][start:end].tolist() == s
    assert not mb["kept_missing"].any()  # every sampled token inside its set


def test_a_group_without_kept_sets_gives_samples_without():
    g = group()
    g.kept = None
    assert all(c.kept is None for c in completions_of([g]))


def test_kept_sets_that_do_not_cover_the_tokens_are_refused():
    short = [arrays([[4], [5]]), arrays([[3], [8], [4]])]
    with pytest.raises(ValueError, match="3 tokens but kept sets for 2 tokens"):
        RolloutGroup(3, [1, 2], TOKENS, [[-0.5] * 3] * 2, [(VersionSpan(0, 0, 3),)] * 2, [True, True], kept=short)
    with pytest.raises(ValueError, match="2 completions but 1 kept-set records"):
        RolloutGroup(3, [1, 2], TOKENS, [[-0.5] * 3] * 2, [(VersionSpan(0, 0, 3),)] * 2, [True, True],
                     kept=short[1:])  # fmt: skip
