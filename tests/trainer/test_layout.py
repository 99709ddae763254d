"""Dependency direction (STYLE: kernels <- losses <- trainer): the trainer never imports triton directly."""

import ast
import pathlib

import fastrl.trainer


def test_trainer_does_not_import_triton():
    root = pathlib.Path(fastrl.trainer.__file__).parent
    offenders = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "triton"]
    assert not offenders, offenders


def test_trainer_files_stay_readable():
    root = pathlib.Path(fastrl.trainer.__file__).parent
    long = {p.name: n for p in root.glob("*.py") if (n := len(p.read_text().splitlines())) >= 500}
    assert not long, long
