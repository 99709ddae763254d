"""A few steps of the real loop (the full tiny run is the README's main job, not a CI test)."""

import pytest
import torch

import fastrl.trainer.scoring as scoring
import fastrl.trainer.update as update
from fastrl.trainer.config import make_config
from fastrl.trainer.metrics import read_metrics
from fastrl.trainer.trainer import train

REQUIRED = (
    "step", "reward_correct_mean", "reward_accuracy_mean", "reward_format_mean", "reward_std", "frac_zero_std_groups",
    "loss", "kl_mean", "clip_frac_low", "clip_frac_high", "entropy_mean", "response_length_mean", "response_length_max",
    "truncation_rate", "tokens_per_s", "elapsed_s",
)  # fmt: skip


@pytest.mark.slow
def test_tiny_loop_logs_every_metric(tmp_path):
    cfg = make_config("tiny", output_dir=str(tmp_path), max_steps=3, warmup_sft_steps=30, prompts_per_step=8,
                      group_size=4, save_steps=0, progress=False)  # fmt: skip
    last = train(cfg)
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [1, 2, 3] and last["step"] == 3
    for r in rows:
        missing = [k for k in REQUIRED if k not in r]
        assert not missing, missing
        assert 0.0 <= r["reward_correct_mean"] <= 1.0 and 0.0 <= r["frac_zero_std_groups"] <= 1.0
        assert r["entropy_mean"] > 0 and r["tokens_per_s"] > 0 and r["response_length_max"] >= r["response_length_mean"]
    assert (tmp_path / "checkpoints" / "step-00000003" / "state.pt").exists()  # the final checkpoint


@pytest.mark.parametrize(
    "options",
    [
        dict(ppo_epochs=2, minibatches=2, beta=0.05, advantage_scale="batch-std", filter_zero_std=True,
             warmup_sft_steps=100, warmup_sft_noise=0.5),
        dict(loss_agg="dr_grpo", length_penalty=0.2, overlong_buffer=4, mask_truncated=True, is_cap=2.0,
             max_completion_length=9, advantage_scale="none", ratio_level="sequence", entropy_coef=0.01),
    ],
    ids=["ppo-epochs-ref-kl-filter", "drgrpo-shaping-is-gspo"],
)  # fmt: skip
@pytest.mark.slow  # two tiny training runs, 13–17 s each
def test_loop_options(tmp_path, options, monkeypatch):
    options = {"warmup_sft_steps": 10, **options}
    configs, shaping = [], []
    real_loss, real_shaped = update.grpo_loss, scoring.shaped_rewards

    def spy_loss(*args, config, rollout_logprobs=None, **kw):
        configs.append((config, rollout_logprobs is not None))
        return real_loss(*args, config=config, rollout_logprobs=rollout_logprobs, **kw)

    def spy_shaped(scores, correct, lengths, config):
        total = real_shaped(scores, correct, lengths, config)
        shaping.append(float((total - torch.tensor(scores.total, dtype=torch.float64)).abs().max()))
        return total

    monkeypatch.setattr(update, "grpo_loss", spy_loss)
    monkeypatch.setattr(scoring, "shaped_rewards", spy_shaped)
    cfg = make_config("tiny", output_dir=str(tmp_path), max_steps=4, prompts_per_step=4, group_size=4, save_steps=0,
                      progress=False, **options)  # fmt: skip
    train(cfg)
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    loss_cfg = configs[0][0]
    if options.get("beta"):
        # old log-probs make the second minibatch's ratio differ from 1; the reference gives a KL
        assert any(r["kl_mean"] > 0 for r in rows[1:])
        assert loss_cfg.beta == 0.05 and sum(r["train_tokens"] for r in rows) > 0
    if options.get("mask_truncated"):
        # the options reach the loss: Dr. GRPO's aggregation, sequence-level ratio (GSPO), the IS cap with the
        # rollout log-probs, the entropy bonus
        got = (loss_cfg.loss_agg, loss_cfg.max_completion_length, loss_cfg.ratio_level, loss_cfg.is_cap)
        assert got == ("seq-mean-token-sum-norm", 9, "sequence", 2.0) and loss_cfg.entropy_coef == 0.01, got
        assert all(has_rollout for _, has_rollout in configs)
        # completions cut at 9 tokens: some are truncated, their tokens leave the loss, and the length /
        # overlong shaping moves the rewards
        cut = [r for r in rows if r["truncation_rate"] > 0]
        assert cut, [r["truncation_rate"] for r in rows]
        n = 4 * 4
        assert all(r["train_tokens"] < r["response_length_mean"] * n for r in cut), [
            (r["train_tokens"], r["response_length_mean"] * n) for r in cut
        ]
        assert max(shaping) > 0, shaping
