"""The README's quoted bench figures are the latest verdict rows of bench/RESULTS.md, and its figure's numbers
are the figure's JSON.

The README quotes the long-CoT step ratios (fastrl's trainer update and `FastRLGRPOTrainer` against stock TRL)
and an op's extra-memory figure; bench/RESULTS.md opens with the "Latest verdict per op" and "Latest verdict per
step" tables. A new run updates the table; this test fails until the README says the same. The paragraph beside
the README's figure quotes ratios of the run drawn (docs/img/readme_bench_cpu.json); a redrawn figure fails this
test until the paragraph is rewritten.
"""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# README phrase -> the (step, against) row of "Latest verdict per step" whose ratio it quotes
STEP_QUOTES = {
    r"fastrl's trainer update took ([\d.]+)× stock TRL's time": ("fastrl's trainer update", "time"),
    r"stock TRL's time at ([\d.]+)× its peak memory": ("fastrl's trainer update", "peak RSS"),
    r"`FastRLGRPOTrainer` ([\d.]+)× TRL's time": ("`FastRLGRPOTrainer`", "time"),
}
OP_QUOTE = (
    r"(\d+)× less extra memory than eager at ([\d,]+) tokens, D = ([\d,]+), V = ([\d,]+) "
    r"\(([\d,]+) against ([\d,]+) MiB"
)


# a row of the README's table beside its figure: "| `grpo_loss`, 1,024 | trl | 0.50× | 0.198× (152 against 765 MiB) |"
FIGURE_QUOTE = r"\| `(\w+)`, ([\d,]+) \| ([\w-]+) \| ([\d.]+)× \| ([\d.]+)× \(([\d,]+) against ([\d,]+) MiB\) \|"
FIGURE_JSON = Path("docs") / "img" / "readme_bench_cpu.json"


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def table(results: str, heading: str) -> list[list[str]]:
    """The body rows (cells stripped) of the first table under `## heading` in RESULTS.md."""
    start = results.find(f"## {heading}\n")
    if start < 0:
        raise AssertionError(f"bench/RESULTS.md has no '## {heading}' section")
    section = results[start:].split("\n## ", 1)[0]
    rows = [ln.strip().strip("|").split("|") for ln in section.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in row] for row in rows[2:]]  # past the header and the |---| line


def step_ratios(results: str) -> dict[tuple[str, str], float]:
    """(step, against) -> the ratio ending the "measured" cell ("882.9 s vs 2,992.3 s: 0.30×" -> 0.30)."""
    out = {}
    for row in table(results, "Latest verdict per step"):
        found = re.search(r":\s*([\d.]+)×\s*$", row[2])
        if found:
            out[(row[0], row[1])] = float(found.group(1))
    return out


def op_memory(results: str) -> dict[tuple[int, int, int], tuple[float, float]]:
    """(N, D, V) of a token_logprobs row against eager's extra memory -> (fastrl MiB, eager MiB)."""
    out = {}
    for row in table(results, "Latest verdict per op"):
        shape = re.fullmatch(r"token_logprobs N=(\d+) D=(\d+) V=(\d+)", row[0])
        mib = re.search(r"\(([\d,]+) / ([\d,]+) MiB\)", row[2])
        if shape and row[1] == "eager, extra memory" and mib:
            out[tuple(int(x) for x in shape.groups())] = (_number(mib.group(1)), _number(mib.group(2)))
    return out


def disagreements(readme: str, results: str) -> list[str]:
    """Each README quote that is missing or differs from RESULTS.md's latest verdict row, in words."""
    readme = " ".join(readme.split())  # a quote may wrap across lines
    steps, ops = step_ratios(results), op_memory(results)
    problems = []
    for phrase, key in STEP_QUOTES.items():
        quoted = re.search(phrase, readme)
        if quoted is None:
            problems.append(f"the README no longer quotes /{phrase}/")
        elif key not in steps:
            problems.append(f"RESULTS.md's latest step verdicts have no '{key[0]} / {key[1]}' row with a ratio")
        elif float(quoted.group(1)) != steps[key]:
            problems.append(
                f"README {quoted.group(0)!r}: RESULTS.md's latest '{key[0]} / {key[1]}' row says {steps[key]}×"
            )
    quoted = re.search(OP_QUOTE, readme)
    if quoted is None:
        return problems + [f"the README no longer quotes /{OP_QUOTE}/"]
    times, n, d, v, ours, eager = (_number(g) for g in quoted.groups())
    row = ops.get((int(n), int(d), int(v)))
    if row is None:
        problems.append(f"RESULTS.md's latest op verdicts have no token_logprobs N={n:.0f} D={d:.0f} V={v:.0f} row")
    elif (ours, eager) != row:
        problems.append(f"README {ours:,.0f} against {eager:,.0f} MiB: RESULTS.md's latest row says {row}")
    elif times != round(row[1] / row[0]):
        problems.append(f"README '{times:.0f}× less': RESULTS.md's {row[1]:,.0f} / {row[0]:,.0f} MiB rounds to "
                        f"{round(row[1] / row[0])}×")  # fmt: skip
    return problems


def _tokens(shape: dict) -> int:
    return shape["N"] if "N" in shape else shape["B"] * shape["T"]


def _same(quoted: str, value: float) -> bool:
    """`value` rounded to as many decimals as `quoted` shows is `quoted`."""
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    return f"{value:,.{decimals}f}" == quoted


def figure_disagreements(readme: str, run: dict) -> list[str]:
    """Each ratio and MiB figure the README quotes for its figure that the run's JSON does not hold."""
    readme = " ".join(readme.split())
    rows = {(r["op"], _tokens(r["shape"]), r["provider"]): r
            for r in run["results"] if r["status"] in ("ok", "ref")}  # fmt: skip
    quotes = list(re.finditer(FIGURE_QUOTE, readme))
    if not quotes:
        return [f"the README no longer quotes its figure as /{FIGURE_QUOTE}/"]
    problems = []
    for q in quotes:
        op, n, peer, time_x, mem_x, ours_mib, peer_mib = q.groups()
        ours, theirs = rows.get((op, int(_number(n)), "fastrl-torch")), rows.get((op, int(_number(n)), peer))
        if ours is None or theirs is None:
            problems.append(
                f"{q.group(0)!r}: the run has no measured {op} row at {n} tokens for fastrl-torch or {peer}"
            )
            continue
        expected = (
            (time_x, ours["median_ms"] / theirs["median_ms"]),
            (mem_x, ours["extra_mib"] / theirs["extra_mib"]),
            (ours_mib, ours["extra_mib"]),
            (peer_mib, theirs["extra_mib"]),
        )
        problems += [f"{q.group(0)!r}: {said} where the run holds {value:.4g}" for said, value in expected
                     if not _same(said, value)]  # fmt: skip
    return problems


def _files() -> tuple[str, str]:
    return (ROOT / "README.md").read_text(), (ROOT / "bench" / "RESULTS.md").read_text()


def test_the_readme_quotes_the_latest_verdict_rows():
    readme, results = _files()
    assert disagreements(readme, results) == []


def test_every_quote_is_read_from_a_row():
    readme, results = _files()
    assert set(STEP_QUOTES.values()) <= set(step_ratios(results))
    assert op_memory(results)


def test_a_changed_step_ratio_is_caught(tmp_path):
    readme, results = _files()
    steps = step_ratios(results)
    ratio = steps[("fastrl's trainer update", "time")]
    changed = results.replace(f": {ratio:.2f}×", f": {ratio + 0.01:.2f}×", 1)
    assert changed != results
    (tmp_path / "RESULTS.md").write_text(changed)
    problems = disagreements(readme, (tmp_path / "RESULTS.md").read_text())
    assert any("'fastrl's trainer update / time' row says" in p for p in problems), problems


def test_a_changed_readme_memory_figure_is_caught():
    readme, results = _files()
    n, d, v = next(iter(op_memory(results)))
    ours, eager = op_memory(results)[(n, d, v)]
    quote = f"({ours:,.0f} against {eager:,.0f} MiB"
    assert quote in " ".join(readme.split())
    changed = " ".join(readme.split()).replace(quote, f"({ours + 1:,.0f} against {eager:,.0f} MiB")
    assert any("MiB: RESULTS.md's latest row" in p for p in disagreements(changed, results))


def _run() -> dict:
    return json.loads((ROOT / FIGURE_JSON).read_text())


def test_the_readme_quotes_its_figure_as_the_run_measured_it():
    assert figure_disagreements((ROOT / "README.md").read_text(), _run()) == []


def test_a_changed_figure_number_is_caught():
    run = _run()
    readme = (ROOT / "README.md").read_text()
    quoted = re.search(FIGURE_QUOTE, " ".join(readme.split()))
    assert quoted is not None
    op, n, peer = quoted.group(1), int(_number(quoted.group(2))), quoted.group(3)
    row = next(r for r in run["results"] if (r["op"], r["provider"], _tokens(r["shape"])) == (op, peer, n))
    row["extra_mib"] *= 1.1
    assert any("where the run holds" in p for p in figure_disagreements(readme, run))
