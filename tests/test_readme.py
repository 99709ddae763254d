"""README.md runs as written: its first command (install, then `fastrl train --preset tiny`) and every python
example, in a fresh venv made from a copy of the working tree as a clone would have it; and its second command is
the test command `.ci/run` runs.

The venv (`make_venv`) sees the packages of the interpreter running the tests, so the README's
`pip install torch==2.13.0` finds the installed torch (seconds, not a download): `--system-site-packages` reaches
the base interpreter's site only, so when the tests run from a virtualenv its site-packages go in through a .pth
file. Its `pip` is the venv's (`<venv>/bin/python -m pip`: pip from the outer site, installing into the venv).
The tiny run gets `--max-steps 2 --warmup-sft-steps 2 --no-progress` appended (the command's meaning is
unchanged; the preset's 300 + 100 steps take minutes). The verl line is a
verl launcher command (verl's own venv and a PPO config), not run here; docs/api.md's verl example is
(tests/integrations/test_readme_integrations.py).
"""

import json
import os
import pathlib
import re
import shutil
import site
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TINY_RUN = " --max-steps 2 --warmup-sft-steps 2 --no-progress"


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README.read_text(encoding="utf-8"), re.S | re.M)
    assert match, f"README.md has no section {title!r}"
    return match.group(1)


def commands() -> list[str]:
    """The two commands of "Install and run", as written."""
    (block,) = re.findall(r"```bash\n(.*?)```", _section("Install and run"), flags=re.S)
    lines = [line.strip() for line in block.splitlines() if line.strip()]
    assert len(lines) == 2, lines
    return lines


def python_blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert blocks, "README.md has no python example"
    return blocks


def test_the_readme_test_command_is_what_ci_runs():
    train, test = commands()
    assert "fastrl train --preset tiny" in train and "pip install -e ." in train
    torch_pin, rest = test.split(" && ", 1)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert torch_pin.replace("pip install ", "python3 -m pip install -q ") in ci, (torch_pin, ci)
    assert rest.replace("pip install ", "python3 -m pip install -q ") in ci, (rest, ci)  # the same extras, pytest


def _tree_copy(dest: pathlib.Path) -> None:
    """The working tree's files as a clone has them: tracked, or untracked but not ignored."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True, timeout=60).stdout  # fmt: skip
    for name in filter(None, listed.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def make_venv(venv: pathlib.Path) -> None:
    """A venv, without its own pip, that sees this interpreter's packages behind its own (module docstring)."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=120)  # fmt: skip
    if sys.prefix != sys.base_prefix:  # a virtualenv: its packages are not the base's "system site"
        (site_dir,) = venv.glob("lib/python*/site-packages")
        (site_dir / "_outer_site.pth").write_text("".join(p + "\n" for p in site.getsitepackages()))
    pip = venv / "bin" / "pip"
    pip.write_text(f'#!/bin/sh\nexec "{venv}/bin/python" -m pip "$@"\n')
    pip.chmod(0o755)


@pytest.mark.slow  # builds two venvs
def test_the_venv_sees_the_packages_of_a_virtualenv_running_the_tests(tmp_path):
    outer = tmp_path / "outer"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(outer)], check=True,
                   timeout=120)  # fmt: skip
    (outer_site,) = outer.glob("lib/python*/site-packages")
    (outer_site / "only_in_the_outer_venv.py").write_text("WHERE = 'outer'\n")
    code = (f"import pathlib, sys; sys.path.insert(0, {str(ROOT / 'tests')!r}); import test_readme; "
            f"test_readme.make_venv(pathlib.Path({str(tmp_path / 'inner')!r}))")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's fastrl, imported by the test module's neighbours
    made = subprocess.run([str(outer / "bin" / "python"), "-c", code], env=env, capture_output=True, text=True,
                          timeout=180)  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    inner = tmp_path / "inner" / "bin" / "python"
    probe = "import only_in_the_outer_venv, pytest; print(only_in_the_outer_venv.WHERE)"
    run = subprocess.run([str(inner), "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "outer", run.stderr[-2000:]  # the outer venv's module and the base's pytest


@pytest.mark.slow
def test_the_readme_runs_as_written_in_a_fresh_venv(tmp_path):
    repo, venv = tmp_path / "fastrl", tmp_path / "venv"
    _tree_copy(repo)
    make_venv(venv)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    env.update(PATH=f"{venv}/bin:{env['PATH']}", VIRTUAL_ENV=str(venv), HF_HUB_OFFLINE="1")
    train = commands()[0]
    proc = subprocess.run(["bash", "-c", train + TINY_RUN], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    steps = [json.loads(line) for line in (repo / "runs" / "tiny" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2], steps
    assert "eval_pass@1" in steps[-1] and "eval_pass@1" not in steps[0], steps  # the last step's eval
    assert (repo / "runs" / "tiny" / "curves.png").stat().st_size > 0  # the figure the README shows beside it
    elsewhere = tmp_path / "examples"  # not the copy's parent: its `fastrl/` folder would shadow the install
    elsewhere.mkdir()
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import fastrl; print(fastrl.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert where.stdout.strip() == str(repo / "fastrl" / "__init__.py"), where  # the venv's install, not another
    for i, code in enumerate(python_blocks()):
        run = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=elsewhere, env=env, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
        assert run.returncode == 0, f"README python block {i}:\n{code}\n{run.stderr[-3000:]}"
