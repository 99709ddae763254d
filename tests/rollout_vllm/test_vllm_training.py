"""The trainer on vLLM rollouts: every batch comes from the trainer's current weights, and the tiny run learns."""

import json

from vllm_reference import ENGINE, TOL, max_gap

from fastrl.trainer import sources
from fastrl.trainer import trainer as loop
from fastrl.trainer.config import make_config
from fastrl.trainer.tiny import CharTokenizer, save_tiny, tiny_model


def record_gaps(monkeypatch) -> list[float]:
    """Make the trainer's engine record, per rollout batch, its log-prob gap to the trainer's live model."""
    gaps = []
    make_engine = sources.make_engine

    def recording(name, model, tokenizer, config):
        engine = make_engine(name, model, tokenizer, config)
        generate = engine.generate

        def checked(prompts, n, want_logprobs=False, **seeding):
            comps = generate(prompts, n, want_logprobs=want_logprobs, **seeding)
            gaps.append(max_gap(model, comps, temperature=config.temperature, top_p=config.top_p))
            return comps

        engine.generate = checked
        return engine

    monkeypatch.setattr(sources, "make_engine", recording)
    return gaps


def test_first_batch_after_warmup_and_after_resume_comes_from_the_trainer_weights(tmp_path, monkeypatch):
    """vLLM loads the model directory from disk; the trainer's weights are then warmed up, or resumed."""
    model_dir = str(tmp_path / "model")
    save_tiny(tiny_model(len(CharTokenizer()), max_len=524), CharTokenizer(), model_dir)
    gaps = record_gaps(monkeypatch)
    common = dict(ENGINE, model=model_dir, is_cap=2.0, warmup_sft_steps=40, prompts_per_step=8, save_steps=2,
                  progress=False, output_dir=str(tmp_path / "run"))  # fmt: skip
    loop.train(make_config("tiny", max_steps=2, **common))
    assert len(gaps) == 2 and max(gaps) < TOL, gaps
    loop.train(make_config("tiny", max_steps=3, resume=True, **common))
    assert len(gaps) == 3 and gaps[2] < TOL, gaps


def test_tiny_run_learns_on_vllm(tmp_path):
    """The tiny main job's acceptance rule on vLLM rollouts (torch.compile on): mean accuracy of the last 10
    steps at least 0.3 above the first 10's."""
    steps, out = 60, tmp_path / "run"
    config = make_config("tiny", engine="vllm", max_steps=steps, save_steps=0, progress=False, output_dir=str(out))
    last = loop.train(config)
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    acc = [r["reward_correct_mean"] for r in rows]
    assert len(acc) == steps and last["step"] == steps
    first, final = sum(acc[:10]) / 10, sum(acc[-10:]) / 10
    print(f"tiny run on vLLM: reward_correct_mean {first:.3f} (steps 1-10) -> {final:.3f} (steps {steps - 9}-{steps})")
    assert final - first >= 0.3, acc
    assert rows[0]["truncation_rate"] < 0.2  # the warmed-up policy ends its answers with EOS from step 1
