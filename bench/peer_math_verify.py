"""fastrl's math verifier against Hugging Face Math-Verify on Math-Verify's own test-suite verdict cases.

Run: ``python -m bench.peer_math_verify [--show-disagreements] [--out results.json]``

The cases (``tests/rewards/data/math_verify_cases.json``, Apache-2.0, each naming its source file and line) carry
Math-Verify's expected verdicts. Both verifiers see each case the way a user would call them, in one run:
fastrl through ``accuracy_reward`` (a prose completion) or ``math_equal`` (a bare answer), Math-Verify through
``parse`` + ``verify`` with the extraction settings its test helper used for that case. Prints agreement with
the expected verdict per source file, the false positives (expected False, judged True) of each, and the
cases where a verifier raised instead of answering ("crashed": counted apart, neither agreement nor False).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
from collections import defaultdict

CASES = pathlib.Path(__file__).resolve().parents[1] / "tests" / "rewards" / "data" / "math_verify_cases.json"


def load_cases() -> list[dict]:
    return json.loads(CASES.read_text())["cases"]


def fastrl_verdicts(cases: list[dict], *, lenient: bool = True, timeout: float = 5.0) -> list[bool]:
    """fastrl's verdict on each case, as a user calls it: prose through the reward, a bare answer directly.

    ``lenient=True`` is evaluation mode (Math-Verify's setting: a completion without a box or marker is judged
    on its last math span or number); ``lenient=False`` is the reward default.
    """
    from fastrl.rewards import batch_accuracy_reward, batch_math_equal

    verdicts: list[bool | None] = [None] * len(cases)
    prose = [i for i, c in enumerate(cases) if c["pred_kind"] == "prose"]
    bare = [i for i, c in enumerate(cases) if c["pred_kind"] != "prose"]
    preds, golds = [cases[i]["pred"] for i in prose], [cases[i]["gold"] for i in prose]
    rewards = batch_accuracy_reward(preds, golds, timeout=timeout, lenient=lenient)
    for i, r in zip(prose, rewards):
        verdicts[i] = r == 1.0
    equal = batch_math_equal([(cases[i]["pred"], cases[i]["gold"]) for i in bare], timeout=timeout)
    for i, e in zip(bare, equal):
        verdicts[i] = e
    return verdicts


def _mv_configs(mv: dict):
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, StringExtractionConfig

    mode = mv["mode"]
    if mode == "compare_strings":
        configs = []
        for kind in mv["match_types"]:
            configs.append(LatexExtractionConfig(boxed_match_priority=0) if kind == "latex" else ExprExtractionConfig())
        return configs
    if mode == "expr_only":
        return [ExprExtractionConfig()]
    if mode == "string_extraction":
        return [eval(mv["config"], {"StringExtractionConfig": StringExtractionConfig})]  # a config repr from the data
    return None  # default_parse: parse's own defaults


def math_verify_verdict(case: dict) -> bool:
    """Math-Verify's verdict on one case, with the extraction settings its test helper used."""
    from math_verify import parse, verify

    mv = case["mv"]
    configs = _mv_configs(mv)
    kwargs = {} if configs is None else {"extraction_config": configs}
    gold, pred = parse(case["gold"], **kwargs), parse(case["pred"], **kwargs)
    if mv["mode"] == "string_extraction":
        return bool(pred) and bool(gold) and verify(gold, pred)
    options = {k: mv[k] for k in ("strict", "allow_set_relation_comp") if k in mv}
    if "precision" in mv:
        options["float_rounding"] = mv["precision"]
    return bool(verify(gold, pred, **options))


def table(cases: list[dict], columns: dict[str, list[bool | None]]) -> str:
    """Agreement, false positives and crashes (None verdicts) per source file and in all."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, c in enumerate(cases):
        groups[c["source"].split("@")[0]].append(i)
    names = list(columns)
    lines = ["| source | cases | " + " | ".join(f"{n} agree | {n} FP | {n} crashed" for n in names) + " |"]
    lines.append("|---" * (2 + 3 * len(names)) + "|")
    for source, idx in sorted(groups.items(), key=lambda kv: -len(kv[1])) + [("all", list(range(len(cases))))]:
        row = [source, str(len(idx))]
        for n in names:
            v = columns[n]
            agree = sum(v[i] is not None and v[i] == cases[i]["expected"] for i in idx)
            fp = sum(v[i] is True and not cases[i]["expected"] for i in idx)
            crashed = sum(v[i] is None for i in idx)
            row += [f"{agree} ({100 * agree / len(idx):.0f}%)", str(fp), str(crashed)]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show-disagreements", action="store_true", help="list every case fastrl gets wrong")
    parser.add_argument("--out", default=None, help="write per-case verdicts as JSON here")
    args = parser.parse_args()
    from importlib.metadata import version

    cases = load_cases()
    ours = fastrl_verdicts(cases)
    rl_mode = fastrl_verdicts(cases, lenient=False)
    theirs: list[bool | None] = []
    crashes: dict[int, str] = {}
    for i, c in enumerate(cases):
        try:
            theirs.append(math_verify_verdict(c))
        except Exception as exc:  # a crash is no verdict: counted apart, never as False
            theirs.append(None)
            crashes[i] = f"{type(exc).__name__}: {exc}"[:200]
    print(f"python {platform.python_version()}, math-verify {version('math-verify')}, load {os.getloadavg()[0]:.1f}")
    print(table(cases, {"fastrl (lenient)": ours, "fastrl (rewards)": rl_mode, "math-verify": theirs}))
    if args.show_disagreements:
        for i, c in enumerate(cases):
            if ours[i] != c["expected"]:
                mark = "FP" if ours[i] else "FN"
                agrees = "crashed" if theirs[i] is None else theirs[i] == c["expected"]
                print(f"{mark} #{i} {c['source']} mv={agrees} pred={c['pred'][-150:]!r} gold={c['gold'][-100:]!r}")
    if args.out:
        with open(args.out, "w") as f:
            rows = [{"index": i, "fastrl": o, "math_verify": t, "math_verify_error": crashes.get(i)}
                    for i, (o, t) in enumerate(zip(ours, theirs))]  # fmt: skip
            json.dump(rows, f)


if __name__ == "__main__":
    main()
