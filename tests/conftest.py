import os
import pathlib
import subprocess

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
