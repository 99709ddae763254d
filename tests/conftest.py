import json
import os
import pathlib
import subprocess
import sys
import time

# The Triton kernels run on CPU tensors through the interpreter; this must be set before triton loads.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def verl_python() -> str:
    """verl's python: `FASTRL_VERL_PYTHON`, else the venv `.ci/verl.sh` builds (reused once built). verl is a peer
    the test run installs, so a missing environment fails; it never skips."""
    py = os.environ.get("FASTRL_VERL_PYTHON")
    if not py:
        script = pathlib.Path(__file__).resolve().parents[1] / ".ci" / "verl.sh"
        proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0 or not proc.stdout.strip():
            pytest.fail(f"{script} failed to build verl's environment: {proc.stderr[-2000:]}")
        py = proc.stdout.strip().splitlines()[-1]
    if not pathlib.Path(py).exists():
        pytest.fail(f"FASTRL_VERL_PYTHON={py!r} does not exist: run .ci/verl.sh")
    return py


@pytest.fixture
def rowwise_dot(monkeypatch):
    """The Triton interpreter's tl.dot one row at a time. Its dot is numpy's sgemm, whose result for a row depends on
    the row's place in the tile (OpenBLAS sums some groups of rows in another order); a GPU's MMA tile does not. A
    batch-invariance test under the interpreter takes this fixture, and then tests everything around the tile."""
    import numpy as np

    matmul = np.matmul

    def rowwise(a, b, **kw):
        if a.ndim != 2:
            return matmul(a, b, **kw)
        return np.concatenate([matmul(a[i : i + 1], b, **kw) for i in range(a.shape[0])])

    monkeypatch.setattr(np, "matmul", rowwise)


@pytest.fixture(scope="session")
def offline_builds():
    """A runner of the `compile_*_kernels.py` scripts, which build kernels for GPU targets without a GPU: `run(script,
    plan, timeout_s)` splits the plan (a JSON list the script takes as its argument) between two processes that build
    side by side with TRITON_INTERPRET=0, and returns the JSON rows both printed. A failed or late process fails."""
    root = pathlib.Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

    def run(script, plan: list, timeout_s: float) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        parts = [plan[i::2] for i in range(2) if plan[i::2]]
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), json.dumps(part)],
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )  # fmt: skip
            for part in parts
        ]
        rows = []
        try:
            for proc in procs:
                out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
                assert proc.returncode == 0, f"{script.name} failed: {err[-4000:]}"
                rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=60)
        return rows

    return run
