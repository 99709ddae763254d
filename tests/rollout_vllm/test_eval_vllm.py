"""Evaluation during training on the in-process vLLM engine: the engine's own greedy answers on the current weights,
the same answers transformers' greedy `generate` gives on the trainer's model at that step (one engine start)."""

import dataclasses
import json

from vllm_reference import ENGINE

from fastrl.trainer import evaluation
from fastrl.trainer import trainer as loop
from fastrl.trainer.config import make_config
from fastrl.trainer.metrics import read_metrics


def test_vllm_evaluates_the_current_weights_as_transformers_does(tmp_path, monkeypatch):
    out = tmp_path / "run"
    config = make_config("tiny", **ENGINE, warmup_sft_steps=40, prompts_per_step=8, max_steps=2, save_steps=0,
                         progress=False, plot=False, output_dir=str(out), eval_dataset="arithmetic-trained",
                         eval_every=2, eval_before_train=True, eval_max_problems=24)  # fmt: skip
    real, engines, hf_rows = evaluation.Evaluator.evaluate, [], {}

    def evaluate_twice(self, run, step):
        """The run's (vLLM) eval, then an HF-generate eval of the same model into a directory of its own."""
        engines.append(type(self.vllm).__name__ if self.vllm is not None else "hf")
        metrics = real(self, run, step)
        reference = dataclasses.replace(self.config, output_dir=str(tmp_path / "hf"))
        hf = evaluation.Evaluator(reference, self.reward, self.sets, run)
        hf_rows[step] = real(hf, run, step)
        return metrics

    monkeypatch.setattr(evaluation.Evaluator, "evaluate", evaluate_twice)
    loop.train(config)
    assert engines == ["VLLMEngine", "VLLMEngine"]
    rows = read_metrics(str(out))
    assert [r["step"] for r in rows] == [0, 1, 2] and "eval_pass@1" not in rows[1]
    for step in (0, 2):
        ours = [json.loads(line) for line in (out / "eval" / f"step-{step}.jsonl").read_text().splitlines()]
        theirs = [
            json.loads(line) for line in (tmp_path / "hf" / "eval" / f"step-{step}.jsonl").read_text().splitlines()
        ]
        assert [r["completions"] for r in ours] == [r["completions"] for r in theirs], step
        row = next(r for r in rows if r["step"] == step)
        assert row["eval_pass@1"] == hf_rows[step]["eval_pass@1"] == sum(r["correct"][0] for r in ours) / 24
    assert rows[2]["eval_pass@1"] > 0  # the warmed-up policy answers some of its training problems
