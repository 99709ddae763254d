"""`python -m bench.gpu --dry-run` runs end to end on CPU (tiny shapes, Triton interpreter), so the GPU check
cannot rot before a GPU is available. About 40 s on 2 quiet cores."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a subprocess
def test_gpu_check_dry_run(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "bench.gpu", "--dry-run"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tail = proc.stdout[proc.stdout.index("**bench.gpu on") :]
    assert all(f"| {part} | PASS |" in tail for part in ("kernels", "replay", "peers", "fsdp", "async")), tail
    parts = json.loads((tmp_path / "gpu.json").read_text())["parts"]
    assert parts["kernels"]["pass"] and len(parts["kernels"]["correctness"]) == 2
    providers = {r["provider"]: r["status"] for r in parts["peers"]["rows"] if r["op"] == "grpo_loss"}
    assert providers["fastrl-torch"] == "ok" and providers["torch-lce"] == "ok" and providers["eager"] == "ref"
    assert parts["fsdp"]["row"]["tokens"] > 0
    assert parts["replay"]["pass"] and parts["replay"]["replay_fwd_bwd_ms"] > 0
    # the colocated async step skipped with its reason on CPU, and the two-GPU case said to be skipped
    assert parts["async"]["skipped"].startswith("dry run: the asynchronous step needs vLLM on CUDA")
    assert "--rollout-gpus case" in parts["async"]["table"] and "needs two GPUs: skipped" in proc.stdout
