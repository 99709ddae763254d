"""The scoring stage on hand-made completions: rewards -> shaping -> advantages -> samples -> metrics."""

import math
from types import SimpleNamespace

import pytest
import torch

from fastrl.rewards import combine_rewards, format_reward
from fastrl.trainer import scoring
from fastrl.trainer.advantages import EPS
from fastrl.trainer.config import make_config
from fastrl.trainer.rollout import Completion


class TableReward:
    """A reward that looks its values up by text: accuracy 1 for texts starting with "ok", format 0.5."""

    def score(self, texts, golds):
        acc = [1.0 if t.startswith("ok") else 0.0 for t in texts]
        fmt = [0.5] * len(texts)
        return SimpleNamespace(total=[a + 0.1 * f for a, f in zip(acc, fmt)], per_fn={"accuracy": acc, "format": fmt})


def _config(**kw):
    return make_config("tiny", group_size=2, **kw)


def _comps(lengths, truncated=None):
    truncated = truncated or [False] * len(lengths)
    return [Completion([1, 5], [7] * n, t, None) for n, t in zip(lengths, truncated)]


def test_score_adds_length_and_overlong_shaping():
    texts, lengths = ["ok a", "no b", "ok c", "ok d"], [4, 8, 10, 12]
    cfg = _config(length_penalty=0.5, overlong_buffer=4, max_completion_length=12)
    s = scoring.score(TableReward(), texts, ["1"] * 4, lengths, cfg)
    base = [1.05, 0.05, 1.05, 1.05]
    # Kimi k1.5 per group of 2: the shorter gets +0.5 (if right), the longer -0.5 (min(0, .) when wrong)
    length = [0.5, -0.5, 0.5, -0.5]
    # DAPO soft overlong with L=12, buffer 4: 0 up to 8 tokens, then linear to -1 at 12
    overlong = [0.0, 0.0, -0.5, -1.0]
    want = [b + 0.5 * p + o for b, p, o in zip(base, length, overlong)]
    assert s.total.dtype == torch.float64
    torch.testing.assert_close(s.total, torch.tensor(want, dtype=torch.float64))
    assert s.correct == [1.0, 0.0, 1.0, 1.0] and s.per_fn["format"] == [0.5] * 4


def test_score_without_accuracy_term_still_measures_correctness():
    reward = combine_rewards([("format", format_reward, 1.0)])
    texts = ["<think>1+2</think>\\boxed{3}", "<think>1+2</think>\\boxed{4}"]
    s = scoring.score(reward, texts, ["3", "3"], [8, 8], _config(rewards=("format:1.0",)))
    assert s.correct == [1.0, 0.0] and list(s.per_fn) == ["format"]
    torch.testing.assert_close(s.total, torch.tensor(s.per_fn["format"], dtype=torch.float64))


def test_advantages_filter_and_mask():
    total = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    cfg = _config(filter_zero_std=True, mask_truncated=True)
    adv, flat = scoring.advantages(total, cfg)
    a = 0.5 / (math.sqrt(0.5) + EPS)  # group [1, 0]: centered +-0.5 over the unbiased std sqrt(0.5)
    assert adv == pytest.approx([a, -a, 0.0, 0.0], rel=1e-6) and flat.tolist() == [False, True]
    samples = scoring.to_samples(_comps([3, 4, 5, 6], truncated=[False, True, False, False]), adv, flat, cfg)
    assert [len(s.completion_ids) for s in samples] == [3, 4]  # the flat group is dropped
    assert [s.loss_mask for s in samples] == [True, False]  # the truncated one stays but carries no loss
    kept = scoring.to_samples(_comps([3, 4, 5, 6]), adv, flat, _config())
    assert len(kept) == 4 and all(s.loss_mask for s in kept)


def test_batch_std_from_moments_matches_torch():
    total = torch.tensor([1.0, 0.0, 3.0, 1.0, 0.5, 2.0], dtype=torch.float64)
    std = scoring.std_from_moments(*scoring.reward_moments(total))
    assert std == pytest.approx(float(total.std()), rel=1e-12)
    # two "ranks" holding halves add their moments: the same std
    a, b = scoring.reward_moments(total[:2]), scoring.reward_moments(total[2:])
    assert scoring.std_from_moments(*[x + y for x, y in zip(a, b)]) == pytest.approx(std, rel=1e-12)
    adv, _ = scoring.advantages(total, _config(advantage_scale="batch-std"), batch_std=std)
    centered = (total.view(-1, 2) - total.view(-1, 2).mean(1, keepdim=True)).view(-1)
    assert adv == pytest.approx((centered / (std + EPS)).tolist(), rel=1e-6)


def test_rollout_metrics_from_sums():
    comps = _comps([2, 4, 6, 8], truncated=[False, False, False, True])
    s = scoring.score(TableReward(), ["ok", "no", "ok", "ok"], ["1"] * 4, [2, 4, 6, 8], _config())
    _, flat = scoring.advantages(s.total, _config())
    sums = scoring.rollout_sums(comps, [3, 5], s, flat, _config())
    m = scoring.rollout_metrics(sums, 8.0)
    rewards = [1.05, 0.05, 1.05, 1.05]
    assert m["reward_mean"] == pytest.approx(sum(rewards) / 4)
    assert m["reward_std"] == pytest.approx(float(torch.tensor(rewards).std(unbiased=False)), rel=1e-6)
    assert m["reward_correct_mean"] == 0.75 and m["reward_accuracy_mean"] == 0.75 and m["reward_format_mean"] == 0.5
    assert m["frac_zero_std_groups"] == 0.5 and m["truncation_rate"] == 0.25
    assert m["response_length_mean"] == 5.0 and m["response_length_max"] == 8.0
    assert m["rollout_tokens"] == 20 + (3 + 5) * 2  # completion tokens + each prompt once per sample


def test_bad_batch_shapes_raise():
    with pytest.raises(ValueError, match="3 texts, 2 gold"):
        scoring.score(TableReward(), ["a", "b", "c"], ["1", "2"], [1, 1, 1], _config())
    with pytest.raises(ValueError, match="groups of 2"):
        scoring.score(TableReward(), ["a", "b", "c"], ["1"] * 3, [1, 1, 1], _config())
