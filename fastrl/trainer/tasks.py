"""Prompt sources: the synthetic arithmetic tasks of the tiny presets, and JSONL / Hugging Face datasets.

Every source yields `Problem(prompt, answer)`: `prompt` is the raw question text, `answer` the gold answer
the accuracy reward compares against. `PromptStream` turns a list of problems into an endless, seeded,
resumable sequence of batches (its `position` is saved in checkpoints). The tiny tasks' warm-up
demonstrations live in `tiny/warmup.py`.

The built-in tasks: `arithmetic:<max operand>`, sums "a+b=" (the tiny preset), and `products:<digits>`, products
"a*b=" of two numbers of that many digits (the tiny-tools preset: beyond the tiny model alone, within its reach
with the python tool).
"""

import json
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str


def arithmetic_problems(n: int, max_operand: int, seed: int) -> list[Problem]:
    """`n` addition problems "a+b=" with 0 <= a, b <= max_operand, drawn with a fixed seed."""
    if n <= 0 or max_operand <= 0:
        raise ValueError(f"n and max_operand must be positive, got n={n}, max_operand={max_operand}")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        out.append(Problem(f"{a}+{b}=", str(a + b)))
    return out


PRODUCTS = "products:"  # the products task's dataset name, before <digits>


def demonstrated(dataset: str) -> bool:
    """Whether the supervised warm-up has demonstrations of `dataset`'s task (the built-in tasks)."""
    return dataset.startswith(("arithmetic", PRODUCTS))


def product_problems(n: int, digits: int, seed: int) -> list[Problem]:
    """`n` multiplication problems "a*b=" with a and b of exactly `digits` digits, drawn with a fixed seed."""
    if n <= 0 or not 1 <= digits <= 9:
        raise ValueError(f"n must be positive and digits in [1, 9], got n={n}, digits={digits}")
    low, high = 10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(low, high), rng.randint(low, high)
        out.append(Problem(f"{a}*{b}=", str(a * b)))
    return out


def load_jsonl(path: str, prompt_key: str = "prompt", answer_key: str = "answer") -> list[Problem]:
    """Problems from a JSONL file with one object per line holding `prompt_key` and `answer_key`."""
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            for key in (prompt_key, answer_key):
                if key not in row:
                    raise ValueError(f"{path}:{lineno} has no key {key!r} (keys: {sorted(row)})")
            out.append(Problem(str(row[prompt_key]), str(row[answer_key])))
    if not out:
        raise ValueError(f"{path} holds no problems")
    return out


def load_hf_dataset(name: str, split: str = "train", prompt_key: str = "problem", answer_key: str = "answer"):
    """Problems from a Hugging Face dataset (needs the `datasets` package and network or a local cache)."""
    try:
        import datasets
    except ImportError as e:
        raise ValueError(f"dataset {name!r} needs the `datasets` package: pip install datasets") from e
    ds = datasets.load_dataset(name, split=split)
    for key in (prompt_key, answer_key):
        if key not in ds.column_names:
            raise ValueError(f"dataset {name!r} has no column {key!r} (columns: {ds.column_names})")
    return [Problem(str(r[prompt_key]), str(r[answer_key])) for r in ds]


def load_problems(source: str, seed: int, **kw) -> list[Problem]:
    """`arithmetic:<max_operand>`, `products:<digits>`, a path ending in .jsonl, or a Hugging Face dataset name."""
    if source.startswith(PRODUCTS):
        digits = source[len(PRODUCTS) :]
        if not digits.isdigit():
            raise ValueError(f"{source!r}: the products task is {PRODUCTS}<digits>, e.g. {PRODUCTS}3")
        return product_problems(kw.get("n", 4096), int(digits), seed)
    if source.startswith("arithmetic"):
        max_operand = int(source.partition(":")[2] or 99)
        return arithmetic_problems(kw.get("n", 4096), max_operand, seed)
    if source.endswith(".jsonl"):
        return load_jsonl(source, kw.get("prompt_key", "prompt"), kw.get("answer_key", "answer"))
    return load_hf_dataset(
        source, kw.get("split", "train"), kw.get("prompt_key", "problem"), kw.get("answer_key", "answer")
    )


class PromptStream:
    """Endless batches of problems: a fresh seeded shuffle each epoch; `position` counts problems served."""

    def __init__(self, problems: list[Problem], seed: int, position: int = 0):
        if not problems:
            raise ValueError("PromptStream needs at least one problem")
        self.problems, self.seed, self.position = problems, seed, position
        self._epoch, self._cached = -1, []

    def _order(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            self._cached = list(range(len(self.problems)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(self._cached)
            self._epoch = epoch
        return self._cached

    def problem_at(self, position: int) -> Problem:
        """The problem served at stream `position` (`position` itself does not move)."""
        if position < 0:
            raise ValueError(f"stream position must be >= 0, got {position}")
        epoch, i = divmod(position, len(self.problems))
        return self.problems[self._order(epoch)[i]]

    def next_batch(self, n: int) -> list[Problem]:
        out = []
        while len(out) < n:
            out.append(self.problem_at(self.position))
            self.position += 1
        return out
