"""`fastrl.integrations.verl` against verl's own code, run in verl's environment (`.ci/verl.sh` builds it;
`FASTRL_VERL_PYTHON` points at its python):

- `verl_checks.py`: the policy loss and the actor's micro-batch step on one process;
- `verl_engine_checks.py`: verl's FSDP2 engine on 2 gloo ranks, tied and untied heads, gradient
  accumulation, remove-padding, the no-grad old/ref pass;
- `verl_ulysses_checks.py`: the same engine with Ulysses sequence parallelism 2.

All three run in one process of verl's python (`verl_all_checks.py`, a module fixture; the two 2-rank files share
one spawn), and each test judges its file's part of the output. The engine parts also run planted mutants of
fastrl's backend (a head read outside its FSDP unit, a head all-gathered by hand, labels rolled per sequence shard)
after the real cases, and fail unless each is caught.
"""

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = ROOT / "tests/integrations"


PARTS = ("checks", "ranks", "engine", "ulysses")  # verl_all_checks.py's parts ("ranks": the spawned ranks' output)


@pytest.fixture(scope="module")
def verl_parts(verl_python, tmp_path_factory) -> dict:
    """{part: its output} of one run of `verl_all_checks.py`; a part that failed holds its `FAILED` line."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE}", "OMP_NUM_THREADS": "1"}
    cmd = [verl_python, str(HERE / "verl_all_checks.py"), str(tmp_path_factory.mktemp("verl"))]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    parts, name = {}, None
    for line in proc.stdout.splitlines():
        if line.startswith("== ") and line[3:] in PARTS:
            name = line[3:]
            parts[name] = ""
        elif name is not None:
            parts[name] += line + "\n"
    assert tuple(parts) == PARTS, proc.stdout[-3000:] + proc.stderr[-4000:]
    failed = [name for name, out in parts.items() if f"== {name} FAILED" in out]
    assert (proc.returncode != 0) == bool(failed), (proc.returncode, failed, proc.stderr[-4000:])
    return {name: out + (proc.stderr[-4000:] if name in failed else "") for name, out in parts.items()}


def _lines(out: str, start: str) -> int:
    return sum(line.startswith(start) for line in out.splitlines())


@pytest.mark.slow
@pytest.mark.timeout(1900)  # the first of these tests to run starts `verl_parts`
def test_verl_checks_pass(verl_parts):
    out = verl_parts["checks"]
    assert "FAILED" not in out and out.count("ok ") == 24, out


@pytest.mark.slow
@pytest.mark.timeout(1900)
def test_verl_fsdp2_engine_with_fastrl_backend_equals_its_logits_path(verl_parts):
    out = verl_parts["engine"]
    print(out)
    assert "FAILED" not in out, out
    assert _lines(out, "ok ") == 4, out  # tied and untied head, on each of the 2 ranks
    assert _lines(out, "caught mutant ") == 4, out  # 2 mutants of the untied head, on each rank


@pytest.mark.slow
@pytest.mark.timeout(1900)
def test_verl_ulysses_with_fastrl_backend_equals_its_logits_path(verl_parts):
    out = verl_parts["ulysses"]
    print(out)
    assert "FAILED" not in out, out
    assert _lines(out, "ok ") == 2, out
    assert _lines(out, "caught mutant planted ") == 2, out
