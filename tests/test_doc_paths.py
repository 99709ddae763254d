"""Every repository path README.md and docs/*.md name exists.

A path is a word that starts with one of the repository's top-level folders (`fastrl/`, `tests/`, `bench/`,
`docs/`, `scripts/`, `.ci/`), in code spans or prose. `<name>` placeholders and `*` match any name; a module
may be named without `.py` (`fastrl/__init__`); a pytest node id or an anchor is cut at `::` / `#`. Paths the
repository ignores (.gitignore: outputs such as `bench/out/`) are places a command writes, not files it holds.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_PATH = re.compile(r"(?<![\w./-])((?:fastrl|tests|bench|docs|scripts|\.ci)/[\w./*<>-]*)")


def named_paths(text: str) -> set[str]:
    out = set()
    for match in _PATH.finditer(text):
        path = re.split(r"::|#", match.group(1))[0].rstrip(".,;:")
        out.add(path)
    return out


def _ignored() -> list[str]:
    lines = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    return [line.strip().strip("/") for line in lines if line.strip() and not line.startswith("#")]


def exists(path: str) -> bool:
    pattern = re.sub(r"<[^>/]*>", "*", path.rstrip("/"))
    if any(pattern == ignored or pattern.startswith(ignored + "/") for ignored in _ignored()):
        return True
    return any(ROOT.glob(pattern)) or any(ROOT.glob(pattern + ".py"))


def test_the_scan_finds_paths_and_a_missing_one_fails():
    text = "see `fastrl/trainer/tasks.py`, tests/test_layout.py::test_x, `fastrl/__init__` and docs/math.md#4."
    assert named_paths(text) == {"fastrl/trainer/tasks.py", "tests/test_layout.py", "fastrl/__init__", "docs/math.md"}
    assert all(exists(p) for p in named_paths(text))
    assert exists("bench/providers*.py") and exists("bench/out/") and exists("fastrl/trainer/<module>.py")
    assert not exists("tests/trainer/test_no_such_file.py") and not exists("fastrl/no_such_package/")


def test_every_path_the_docs_name_exists():
    missing = [f"{doc.relative_to(ROOT)}: {path}" for doc in DOCS for path in
               sorted(named_paths(doc.read_text(encoding="utf-8"))) if not exists(path)]  # fmt: skip
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)
