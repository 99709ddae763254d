"""pytest-benchmark entry: `pytest bench/ --benchmark-only` (bench/ is outside the default testpaths).

tests/conftest.py sets TRITON_INTERPRET=1 for the unit tests; it is not loaded when only bench/ is
collected. If both are collected in one session, the Triton provider is skipped (its reason says
why) rather than timing the interpreter.
"""

import pytest
import torch

from bench.harness import ShapeCache


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="session")
def shape_cache() -> ShapeCache:
    return ShapeCache()
