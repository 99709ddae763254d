"""Every bench module imports: a bench script that fails at import (a name moved out of harness.py, say) is
otherwise found only by the person who runs it."""

import importlib
import pathlib

import pytest

MODULES = sorted(
    p.stem for p in pathlib.Path(__file__).parent.glob("*.py") if p.stem not in ("__init__", "__main__", "conftest")
)


@pytest.mark.parametrize("name", MODULES)
def test_bench_module_imports(name):
    importlib.import_module(f"bench.{name}")
