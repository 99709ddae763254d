"""The kernel package's shape: imports only torch, triton and itself; every module has `__all__` and stays short."""

import ast
import pathlib
import sys

import fastrl.kernels

ROOT = pathlib.Path(fastrl.kernels.__file__).parent
MODULES = sorted(ROOT.rglob("*.py"))


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module


def test_kernels_import_only_torch_triton_and_the_standard_library():
    allowed = {"torch", "triton"} | set(sys.stdlib_module_names)
    offenders = [
        f"{p.relative_to(ROOT)}: {name}" for p in MODULES for name in _imports(p) if name.split(".")[0] not in allowed
    ]
    assert not offenders, offenders


def test_every_module_declares_all_and_stays_readable():
    missing = [str(p.relative_to(ROOT)) for p in MODULES if "__all__" not in p.read_text()]
    long = {str(p.relative_to(ROOT)): n for p in MODULES if (n := len(p.read_text().splitlines())) > 400}
    assert not missing and not long, (missing, long)
