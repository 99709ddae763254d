"""`fastrl.integrations.verl` against verl's own loss and fused forward (`verl_checks.py`, run in verl's
environment, which `.ci/verl.sh` builds; `FASTRL_VERL_PYTHON` points at its python)."""

import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_verl_checks_pass(verl_python):
    py = verl_python
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [py, str(ROOT / "tests/integrations/verl_checks.py")], env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.count("ok ") == 23, proc.stdout
