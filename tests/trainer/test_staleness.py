"""Version spans, the admission rule and the staleness metrics of asynchronous rollouts (docs/math.md §10)."""

from types import SimpleNamespace

import pytest

from fastrl.trainer.staleness import (
    RolloutGroup,
    VersionSpan,
    admit,
    admitted,
    parse_spans,
    staleness_stats,
    stitch,
    token_versions,
)


def group(prompt_id, *spans_per_completion):
    n = [s[-1].end if s else 0 for s in spans_per_completion]
    return RolloutGroup(prompt_id, [1, 2], [[5] * k for k in n], [[-0.5] * k for k in n],
                        [tuple(s) for s in spans_per_completion], [False] * len(n))  # fmt: skip


def test_parse_spans_reads_vllm_labels_and_its_default():
    w = lambda v, s, e: SimpleNamespace(version=v, start=s, end=e)  # noqa: E731
    assert parse_spans([w("3", 0, 2), w("4", 2, 5)], 5, fallback=9) == (VersionSpan(3, 0, 2), VersionSpan(4, 2, 5))
    assert parse_spans([w("default", 0, 4)], 4, fallback=2) == (VersionSpan(2, 0, 4),)
    assert parse_spans(None, 3, fallback=1) == (VersionSpan(1, 0, 3),)
    assert parse_spans(None, 0, fallback=1) == ()
    with pytest.raises(ValueError, match="do not tile"):
        parse_spans([w("3", 0, 2)], 5, fallback=0)


def test_stitch_shifts_pieces_and_merges_equal_versions():
    pieces = [(VersionSpan(0, 0, 3),), (VersionSpan(0, 0, 1), VersionSpan(1, 1, 3)), (VersionSpan(2, 0, 2),)]
    spans = stitch(pieces, [3, 3, 2])
    assert spans == (VersionSpan(0, 0, 4), VersionSpan(1, 4, 6), VersionSpan(2, 6, 8))
    assert token_versions(spans) == [0, 0, 0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="do not tile"):
        stitch(pieces, [3, 4, 2])  # a piece's spans must cover exactly its tokens


def test_admission_keeps_groups_whose_oldest_token_is_at_most_k_behind():
    fresh = group(0, [VersionSpan(3, 0, 4)], [VersionSpan(4, 0, 2)])
    stale = group(1, [VersionSpan(2, 0, 1), VersionSpan(4, 1, 9)], [VersionSpan(4, 0, 3)])  # one old token
    assert fresh.oldest_version == 3 and stale.oldest_version == 2
    assert admitted(fresh, 4, 1) and not admitted(stale, 4, 1) and admitted(stale, 4, 2)
    kept, dropped = admit([stale, fresh], trainer_version=4, max_staleness=1)
    assert kept == [fresh] and dropped == [stale]
    with pytest.raises(ValueError, match="after trainer version"):
        admitted(fresh, 2, 5)  # sampled by weights the trainer has not made yet
    with pytest.raises(ValueError, match="async_staleness"):
        admitted(fresh, 4, -1)


def test_staleness_is_token_weighted_over_the_step():
    a = group(0, [VersionSpan(3, 0, 4)], [VersionSpan(4, 0, 2)])
    b = group(1, [VersionSpan(2, 0, 1), VersionSpan(4, 1, 9)])
    stats = staleness_stats([a, b], trainer_version=4)
    assert stats["staleness_max"] == 2.0
    assert stats["staleness_mean"] == pytest.approx((4 * 1 + 2 * 0 + 1 * 2 + 8 * 0) / (4 + 2 + 9))
    assert staleness_stats([], 4) == {"staleness_mean": 0.0, "staleness_max": 0.0}


def test_a_group_checks_its_shapes():
    with pytest.raises(ValueError, match="log-probs"):
        RolloutGroup(0, [1], [[5, 6]], [[-1.0]], [(VersionSpan(0, 0, 2),)], [False])
    with pytest.raises(ValueError, match="do not tile"):
        RolloutGroup(0, [1], [[5, 6]], [[-1.0, -1.0]], [(VersionSpan(0, 0, 1),)], [False])
