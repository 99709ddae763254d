import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from fastrl.trainer.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from fastrl.trainer.metrics import MetricsLogger, read_metrics, truncate_log
from fastrl.trainer.tiny import tiny_model


def _state(seed):
    model = tiny_model(32, hidden_size=16, num_layers=1, num_heads=2, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (s + 1))
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    sched.step()
    return model, opt, sched


def test_round_trip_restores_everything_and_prunes(tmp_path):
    model, opt, sched = _state(0)
    for step in (5, 10, 15):
        save_checkpoint(str(tmp_path), step, model, opt, sched, {"data_position": step * 3}, keep=2)
    assert [os.path.basename(p) for p in list_checkpoints(str(tmp_path))] == ["step-00000010", "step-00000015"]
    want_rand = torch.rand(3)  # the RNG stream right after the last save
    m2, o2, s2 = _state(1)
    state = load_checkpoint(latest_checkpoint(str(tmp_path)), m2, o2, s2)
    assert state["step"] == 15 and state["data_position"] == 45
    assert torch.equal(torch.rand(3), want_rand)
    for a, b in zip(model.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(a, b)
    assert o2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    assert s2.last_epoch == sched.last_epoch


def test_half_written_checkpoint_is_ignored(tmp_path):
    model, opt, sched = _state(0)
    save_checkpoint(str(tmp_path), 4, model, opt, sched, {"data_position": 0})
    os.makedirs(tmp_path / "checkpoints" / ".tmp-step-00000008")  # a kill while saving step 8
    assert latest_checkpoint(str(tmp_path)).endswith("step-00000004")


def test_truncate_log_keeps_each_step_once(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": s} for s in (1, 2, 3, 4, 3, 4, 5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 6, "los')  # torn last line
    assert truncate_log(str(path), 4) == 4
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2, 3, 4]
    log = MetricsLogger(str(tmp_path), resume_step=2)
    log.log({"step": 3, "x": float("nan")})
    log.close()
    assert read_metrics(str(tmp_path)) == [{"step": 1}, {"step": 2}, {"step": 3, "x": None}]


def _cmd(out, *extra):
    return [sys.executable, "-m", "fastrl.trainer", "train", "--preset", "tiny", "--output-dir", str(out),
            "--max-steps", "8", "--save-steps", "2", "--warmup-sft-steps", "20", "--prompts-per-step", "8",
            "--group-size", "4", "--no-progress", *extra]  # fmt: skip


@pytest.mark.slow
def test_sigkill_then_resume_logs_every_step_once(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(_cmd(out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 180
    try:
        while time.time() < deadline and proc.poll() is None:
            ckpt = latest_checkpoint(str(out))
            logged = [r["step"] for r in read_metrics(str(out))] if ckpt else []
            # kill once a step beyond the checkpoint is logged: the resume must drop and redo it
            if ckpt is not None and int(ckpt.rsplit("-", 1)[1]) >= 4 and max(logged) > int(ckpt.rsplit("-", 1)[1]):
                break
            time.sleep(0.05)
        assert proc.poll() is None, (
            "the run finished (or died) before it could be killed: " + proc.stderr.read().decode()[-2000:]
        )
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    killed_at = int(latest_checkpoint(str(out)).rsplit("-", 1)[1])
    assert 4 <= killed_at < 8
    assert max(r["step"] for r in read_metrics(str(out))) > killed_at
    resumed = subprocess.run(_cmd(out, "--resume"), env=env, capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = read_metrics(str(out))
    assert [r["step"] for r in rows] == list(range(1, 9)), [r["step"] for r in rows]
    assert latest_checkpoint(str(out)).endswith("step-00000008")
    # weights, optimizer, RNG and data position all came back: the resumed steps are the very steps an
    # uninterrupted run takes
    ref = tmp_path / "ref"
    done = subprocess.run(_cmd(ref), env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    for got, want in zip(rows, read_metrics(str(ref))):
        for key in ("entropy_mean", "response_length_mean", "reward_mean", "loss"):
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), (got["step"], key)
