"""Sharded (DCP) checkpoints on 2 gloo ranks: a SIGKILL mid-save leaves the last complete checkpoint.

The kill test runs real processes (like torchrun, one per rank): rank 1 kills itself with SIGKILL after
writing its shard of checkpoint 2 and before the metadata; the surviving rank is then killed as torchrun
would. A resume must find checkpoint 1 and restore weights, optimizer, scheduler and each rank's RNG.
The trainer test kills a real `--fsdp` run and resumes it with `--resume`: every step is logged once and
the resumed steps are the very steps of an uninterrupted run.
"""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from fastrl.trainer.checkpoint import latest_checkpoint
from fastrl.trainer.metrics import read_metrics
from fastrl.trainer.sharded_checkpoint import export_hf

CHILD = os.path.join(os.path.dirname(__file__), "_ckpt_child.py")


def _port() -> str:
    with socket.socket() as sock:  # a free port, so parallel sessions do not collide
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def _ranks(cmd, world=2):
    port = _port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    return [
        subprocess.Popen(
            cmd,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for r in range(world)
    ]


def _kill_all(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigkill_mid_save_leaves_the_last_complete_checkpoint(tmp_path):
    out = str(tmp_path)
    procs = _ranks([sys.executable, CHILD, "save", out, "1"])
    try:
        assert procs[1].wait(timeout=180) == -signal.SIGKILL, procs[1].stderr.read().decode()[-3000:]
    finally:
        _kill_all(procs)  # the survivor waits in a collective: end it, as torchrun does
    ckpts = os.path.join(out, "checkpoints")
    assert latest_checkpoint(out).endswith("step-00000001")
    half = os.path.join(ckpts, ".tmp-step-00000002")
    assert "__1_0.distcp" in os.listdir(half) and ".metadata" not in os.listdir(half)  # killed mid-save
    procs = _ranks([sys.executable, CHILD, "resume", out])
    try:
        for p in procs:
            assert p.wait(timeout=180) == 0, p.stderr.read().decode()[-3000:]
    finally:
        _kill_all(procs)
    assert latest_checkpoint(out).endswith("step-00000002")
    assert not os.path.exists(half)


def test_export_and_resume_refuse_the_wrong_kind_of_checkpoint(tmp_path):
    from fastrl.trainer.cli import main
    from fastrl.trainer.config import make_config

    os.makedirs(tmp_path / "checkpoints" / "step-00000002")  # a replicated checkpoint has no DCP metadata
    assert main(["export", str(tmp_path / "checkpoints" / "step-00000002"), str(tmp_path / "hf")]) == 2
    from fastrl.trainer.build import start_run

    config = make_config("tiny", output_dir=str(tmp_path), resume=True, fsdp=True)
    with pytest.raises(ValueError, match="torchrun"):  # --fsdp on one process: refused before any model
        start_run(config)


def _train(out, *extra):
    return [sys.executable, "-m", "fastrl.trainer", "train", "--preset", "tiny", "--output-dir", str(out),
            "--max-steps", "6", "--save-steps", "2", "--warmup-sft-steps", "5", "--prompts-per-step", "4",
            "--group-size", "4", "--no-progress", "--fsdp", *extra]  # fmt: skip


def _torchrun(cmd):
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", _port(), *cmd[1:]]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fsdp_trainer_killed_then_resumed_logs_every_step_once(tmp_path):
    out = tmp_path / "run"
    procs = _ranks(_train(out))
    deadline = time.time() + 240
    try:
        while time.time() < deadline and all(p.poll() is None for p in procs):
            ckpt = latest_checkpoint(str(out))
            logged = [r["step"] for r in read_metrics(str(out))] if ckpt else []
            if ckpt is not None and max(logged) > int(ckpt.rsplit("-", 1)[1]):
                break
            time.sleep(0.05)
        assert all(p.poll() is None for p in procs), "the run ended before it could be killed: " + "".join(
            p.stderr.read().decode()[-2000:] for p in procs
        )
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
    finally:
        _kill_all(procs)
    killed_at = int(latest_checkpoint(str(out)).rsplit("-", 1)[1])
    assert 2 <= killed_at < 6 and max(r["step"] for r in read_metrics(str(out))) > killed_at
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    resumed = subprocess.run(_torchrun(_train(out, "--resume")), env=env, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = read_metrics(str(out))
    assert [r["step"] for r in rows] == list(range(1, 7)), [r["step"] for r in rows]
    assert latest_checkpoint(str(out)).endswith("step-00000006")
    ref = tmp_path / "ref"
    done = subprocess.run(_torchrun(_train(ref)), env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    for got, want in zip(rows, read_metrics(str(ref))):
        for key in ("entropy_mean", "response_length_mean", "reward_mean", "loss", "grad_norm"):
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), (got["step"], key)
    # the exported Hugging Face directory holds the checkpoint's weights
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoModelForCausalLM

    path = latest_checkpoint(str(out))
    export_hf(path, str(tmp_path / "hf"))
    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).state_dict()
    dcp_to_torch_save(path, str(tmp_path / "full.pt"))
    saved = torch.load(tmp_path / "full.pt", weights_only=False)["model"]
    for name, t in saved.items():
        assert torch.equal(exported[name], t), name
