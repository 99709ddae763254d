"""The trainer's real entry point under torchrun on two gloo ranks (the step equality is tests/distributed)."""

import os
import socket
import subprocess
import sys

import pytest

from fastrl.trainer.metrics import read_metrics


@pytest.mark.slow
def test_torchrun_two_ranks_end_to_end(tmp_path):
    """The real entry point under torchrun: ranks shard prompts, rank 0 logs every step once."""
    out = tmp_path / "run"
    with socket.socket() as sock:  # a free port, so parallel sessions do not collide
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", port,
           "-m", "fastrl.trainer", "train", "--preset", "tiny", "--output-dir", str(out), "--max-steps", "2",
           "--warmup-sft-steps", "5", "--prompts-per-step", "4", "--group-size", "4", "--save-steps", "1",
           "--no-progress"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(str(out))
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0.0 <= r["reward_correct_mean"] <= 1.0 for r in rows)
