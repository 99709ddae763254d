"""`fastrl.losses` reaches the kernels only through `fastrl.kernels`' public names."""

import ast
import pathlib

import fastrl.kernels
import fastrl.losses

ROOT = pathlib.Path(fastrl.losses.__file__).parent
MODULES = sorted(ROOT.rglob("*.py"))


def test_losses_import_only_public_kernel_names():
    offenders = []
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                bad = [a.name for a in node.names if a.name.split(".")[0] == "triton"]
                bad += [a.name for a in node.names if a.name.startswith("fastrl.kernels")]
                offenders += [f"{path.name}: import {name}" for name in bad]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fastrl.kernels"):
                private = [a.name for a in node.names if a.name not in fastrl.kernels.__all__]
                if node.module != "fastrl.kernels" or private:
                    offenders.append(f"{path.name}: from {node.module} import {[a.name for a in node.names]}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "triton":
                offenders.append(f"{path.name}: from {node.module}")
    assert not offenders, offenders


def test_every_module_declares_all_and_stays_readable():
    missing = [p.name for p in MODULES if "__all__" not in p.read_text()]
    long = {p.name: n for p in MODULES if (n := len(p.read_text().splitlines())) > 400}
    assert not missing and not long, (missing, long)
