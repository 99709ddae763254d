"""The trainer package's docstring is its map: it names every module of the package."""

import pathlib
import re

import fastrl.trainer

ROOT = pathlib.Path(fastrl.trainer.__file__).parent


def _missing(doc: str) -> list[str]:
    names = sorted({p.name for p in ROOT.rglob("*.py") if p.name != "__init__.py"})
    return [n for n in names if not re.search(rf"(?<![\w.]){re.escape(n)}", doc)]


def test_the_docstring_names_every_module():
    doc = fastrl.trainer.__doc__
    assert not _missing(doc)
    # sharded_checkpoint.py does not stand in for it
    assert _missing(doc.replace(" checkpoint.py", " ")) == ["checkpoint.py"]
