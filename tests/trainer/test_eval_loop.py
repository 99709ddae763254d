"""Evaluation inside the training loop: a run with eval trains exactly as one without (the same training metrics,
step by step, across a resume), its eval rows fall on the schedule once each, and under torchrun the ranks' shards
are gathered on rank 0, which alone writes the row and the per-problem file."""

import json
import os
import socket
import subprocess
import sys

import pytest

from fastrl.trainer.config import make_config
from fastrl.trainer.metrics import read_metrics
from fastrl.trainer.trainer import train

TINY = dict(warmup_sft_steps=10, prompts_per_step=4, group_size=4, save_steps=2, progress=False, plot=False)
EVAL = dict(eval_dataset="h=arithmetic-heldout:19,t=arithmetic-trained", eval_every=2, eval_before_train=True,
            eval_samples=2, eval_max_problems=6)  # fmt: skip
TIMED = ("elapsed_s", "rollout_s", "step_s", "tokens_per_s")


def _training_columns(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("eval_") and k not in TIMED}


@pytest.mark.slow  # three short tiny runs, about 25 s
def test_a_run_with_eval_trains_as_one_without_and_resumes_its_eval_rows(tmp_path):
    train(make_config("tiny", output_dir=str(tmp_path / "plain"), max_steps=4, **TINY))
    out = str(tmp_path / "eval")
    train(make_config("tiny", output_dir=out, max_steps=2, **TINY, **EVAL))
    assert [r["step"] for r in read_metrics(out)] == [0, 1, 2]
    train(make_config("tiny", output_dir=out, max_steps=4, resume=True, **TINY, **EVAL))
    plain, rows = read_metrics(str(tmp_path / "plain")), read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]  # the step-0 row once, no step twice
    assert [_training_columns(r) for r in rows[1:]] == [_training_columns(r) for r in plain]
    evaluated = [r["step"] for r in rows if "eval_h_pass@1" in r]
    assert evaluated == [0, 2, 4] and sorted(os.listdir(os.path.join(out, "eval"))) == [
        "step-0.jsonl",
        "step-2.jsonl",
        "step-4.jsonl",
    ]
    assert rows[0].keys() == {"step", "elapsed_s", "eval_version"} | {k for k in rows[2] if k.startswith("eval_")}
    names = ("pass@1", "pass@2", "maj@2", "reward_mean", "reward_correct_mean", "response_length_mean",
             "truncation_rate", "time_s")  # fmt: skip
    for row in rows:
        if "eval_version" in row:
            assert row["eval_version"] == row["step"]
            assert {f"eval_{s}_{m}" for s in "ht" for m in names} <= row.keys()


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


@pytest.mark.slow  # one two-rank tiny run, about 30 s
def test_torchrun_ranks_evaluate_their_shards_and_rank_zero_writes_them_once(tmp_path):
    """Under --fsdp: 3 problems x 8 samples in calls of one problem are 2 generate calls on rank 0 and 1 on rank 1,
    which must run as many (each gathers the sharded layers) or the ranks wait on each other until the timeout."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", _free_port(),
           "-m", "fastrl.trainer", "train", "--preset", "tiny", "--output-dir", str(out), "--max-steps", "2",
           "--warmup-sft-steps", "5", "--prompts-per-step", "4", "--group-size", "4", "--save-steps", "0",
           "--no-progress", "--no-plot", "--fsdp", "--eval-dataset", "arithmetic-heldout:19", "--eval-every", "2",
           "--eval-max-problems", "3", "--eval-samples", "8"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(str(out))
    assert [r["step"] for r in rows] == [1, 2] and "eval_pass@1" in rows[1] and "eval_pass@1" not in rows[0]
    problems = [json.loads(line) for line in (out / "eval" / "step-2.jsonl").read_text().splitlines()]
    assert [p["problem_id"] for p in problems] == ["0", "1", "2"]  # both ranks' shards, in order, once
    assert all(len(p["completions"]) == 8 for p in problems)
    assert rows[1]["eval_pass@1"] == pytest.approx(sum(sum(p["correct"]) for p in problems) / 24)
    assert rows[1]["eval_reward_mean"] == pytest.approx(sum(sum(p["rewards"]) for p in problems) / 24)
