"""docs/api.md's "Use it from TRL" / "Use it from verl" sections run as written (README.md links to them; its
own examples run in tests/test_readme.py)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "api.md"


def _blocks(title: str) -> str:
    text = API.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"docs/api.md has no section {title!r}"
    code = re.findall(r"```python\n(.*?)```", match.group(1), flags=re.S)
    assert code, f"docs/api.md section {title!r} has no python block"
    return "\n".join(code)


@pytest.mark.slow
def test_use_it_from_trl_runs(tmp_path):
    code = _blocks("Use it from TRL") + "\nassert trainer.state.global_step == 1, trainer.state.global_step\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_use_it_from_verl_runs(tmp_path, verl_python):
    py = verl_python
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [py, "-c", _blocks("Use it from verl")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
