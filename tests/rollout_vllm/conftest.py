"""The vLLM tests run where vLLM is importable (its own venv: `bash .ci/vllm.sh`); elsewhere they are not collected.
Every one of them is `slow`: it runs in a venv of its own, and vLLM's engine starts processes (`lscpu`, workers).

`FASTRL_REQUIRE_VLLM=1` (set by .ci/vllm.sh) turns a missing vLLM into a collection error, so the CI job
can never pass by skipping them.
"""

import importlib.util
import os
import pathlib

import pytest

# A spec without an origin is a namespace package: this very folder, when tests/ is on sys.path.
_spec = importlib.util.find_spec("vllm")
HAVE_VLLM = _spec is not None and _spec.origin is not None
if not HAVE_VLLM and os.environ.get("FASTRL_REQUIRE_VLLM") == "1":
    raise RuntimeError("FASTRL_REQUIRE_VLLM=1 but vllm is not importable in this Python")
collect_ignore_glob = [] if HAVE_VLLM else ["test_*.py"]

# In-process engine (the weights are synced by reference) and no hub look-ups.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_collection_modifyitems(items):
    here = pathlib.Path(__file__).parent
    for item in items:  # the hook sees the whole session's items: mark this folder's only
        if here in item.path.parents:
            item.add_marker(pytest.mark.slow)
