"""Every test file runs in CI: each `test_*.py` in the repository is under pyproject's `testpaths` (what a bare
`pytest`, and so `.ci/run`, collects) or in NOT_COLLECTED with the reason it is not."""

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]

NOT_COLLECTED = {
    # pytest-benchmark timing files: each case's correctness is checked before it is timed, and the timings are
    # only meaningful on a quiet machine; `python -m bench` runs them (docs/bench.md)
    "bench/test_bench_grpo_loss.py": "pytest-benchmark timings of grpo_loss",
    "bench/test_bench_token_logprobs.py": "pytest-benchmark timings of token_logprobs",
}
_SKIPPED_DIRS = {".git", "__pycache__", "build", "dist", "runs", "node_modules"}


def repo_test_files() -> list[str]:
    """The repository's `test_*.py` files, relative to its root (hidden and output folders left out)."""
    out = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in _SKIPPED_DIRS and not d.endswith(".egg-info")]
        for name in files:
            if name.startswith("test_") and name.endswith(".py"):
                out.append(pathlib.Path(folder, name).relative_to(ROOT).as_posix())
    return sorted(out)


def collected(path: str, testpaths: list[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in testpaths)


def test_every_test_file_is_collected_or_listed(pytestconfig):
    testpaths = pytestconfig.getini("testpaths")
    assert testpaths, "pyproject.toml sets no testpaths"
    files = repo_test_files()
    assert "tests/test_collection.py" in files and "bench/test_async_model.py" in files
    neither = [f for f in files if not collected(f, testpaths) and f not in NOT_COLLECTED]
    assert not neither, f"test files neither in testpaths {testpaths} nor in NOT_COLLECTED: {neither}"
    for path in NOT_COLLECTED:
        assert path in files, f"NOT_COLLECTED names {path}, which does not exist"
        assert not collected(path, testpaths), f"{path} is in NOT_COLLECTED but testpaths collects it"
