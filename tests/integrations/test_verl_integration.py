"""`fastrl.integrations.verl` against verl's own code, run in verl's environment (`.ci/verl.sh` builds it;
`FASTRL_VERL_PYTHON` points at its python):

- `verl_checks.py`: the policy loss and the actor's micro-batch step on one process;
- `verl_engine_checks.py`: verl's FSDP2 engine on 2 gloo ranks, tied and untied heads, gradient
  accumulation, remove-padding, the no-grad old/ref pass;
- `verl_ulysses_checks.py`: the same engine with Ulysses sequence parallelism 2.

The two engine launches also run planted mutants of fastrl's backend (a head read outside its FSDP unit, a head
all-gathered by hand, labels rolled per sequence shard) after the real cases, and fail unless each is caught.
"""

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = ROOT / "tests/integrations"


def _run_in_verl(py, script, *args, timeout=900):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([py, str(HERE / script), *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    return proc.stdout


def _lines(out: str, start: str) -> int:
    return sum(line.startswith(start) for line in out.splitlines())


@pytest.mark.slow
def test_verl_checks_pass(verl_python):
    assert _run_in_verl(verl_python, "verl_checks.py").count("ok ") == 24


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_verl_fsdp2_engine_with_fastrl_backend_equals_its_logits_path(verl_python, tmp_path):
    out = _run_in_verl(verl_python, "verl_engine_checks.py", str(tmp_path))
    print(out)
    assert _lines(out, "ok ") == 4, out  # tied and untied head, on each of the 2 ranks
    assert _lines(out, "caught mutant ") == 4, out  # 2 mutants of the untied head, on each rank


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_verl_ulysses_with_fastrl_backend_equals_its_logits_path(verl_python, tmp_path):
    out = _run_in_verl(verl_python, "verl_ulysses_checks.py", str(tmp_path))
    print(out)
    assert _lines(out, "ok ") == 2, out
    assert _lines(out, "caught mutant planted ") == 2, out
