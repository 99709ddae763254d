"""The --acceptance targets, the floor checks and the one-line verdict that counts their failures.

A target compares fastrl's row with a reference row of the same (op, mode, shape, dtype): eager, a floor,
the fastest correct peer of the run, or each peer lean enough in memory. A floor beaten by any candidate
it binds is an ERROR, not a pass: the floor, or the candidate's correctness, is then wrong. `blas-floor`
binds every provider; `recompute-floor` the ones that must recompute the logits (`recompute_bound`: extra
memory below half the live rows' float32 logits, or, unmeasured, the provider's `recomputes` flag). A
target whose rows were not measured counts as a failure too, so the verdict passes only when every target
was measured and met.

Every target is a live-row target: fastrl scores the live rows only, so the peers it is compared with are the
ones that score the live rows too. A peer that scores every row (`all_rows`: Liger's `[B, T]` interface,
`trl-all-rows`) does more work: it is shown beside the peer targets, labelled, and never compared. A live-row
peer that gave no figures (not run, n/a, error, wrong answer) is a MISSING row with its reason: never a pass,
and a run with one is INCOMPLETE at best; a peer target with no measured peer at all is not measured (FAIL).
"""

from bench.harness import Result
from bench.providers import PEERS, TOKEN_LOGPROBS_PROVIDERS
from bench.report import shape_str

# (op, candidate, reference, quantity, bound): time / memory ratio candidate ÷ reference ≤ bound
# ("lean-peers": strictly below 1 against every peer whose extra memory is ≤ 1/4 of eager's)
TARGETS = [
    ("grpo_loss", "fastrl-torch", "fastest-peer", "time", 0.85),
    ("grpo_loss", "fastrl-torch", "blas-floor", "time", 1.10),
    ("grpo_loss", "fastrl-torch", "eager", "memory", 0.10),
    ("token_logprobs", "fastrl-torch", "eager", "time", 0.90),
    ("token_logprobs", "fastrl-torch", "recompute-floor", "time", 1.05),
    ("token_logprobs", "fastrl-torch", "lean-peers", "time", 1.0),
    ("token_logprobs", "fastrl-torch", "eager", "memory", 0.10),
]
LEAN = 0.25  # a peer is "lean" when its extra memory is at most this fraction of eager's


def _provider(op: str, provider: str):
    if op == "token_logprobs":
        return TOKEN_LOGPROBS_PROVIDERS.get(provider)
    from bench.providers_grpo import GRPO_LOSS_PROVIDERS

    return GRPO_LOSS_PROVIDERS.get(provider)


def _recomputes(op: str, provider: str) -> bool:
    p = _provider(op, provider)
    return bool(p and p.recomputes)


def all_rows(op: str, provider: str) -> bool:
    """Does `provider` score every row of `op`, the ignored ones too (more work than fastrl's live rows)?"""
    p = _provider(op, provider)
    return bool(p and p.all_rows)


def live_row_peers(op: str) -> list[str]:
    """The peers a live-row target of `op` compares against: every peer of the op that scores live rows."""
    from bench.providers_grpo import GRPO_LOSS_PROVIDERS

    names = TOKEN_LOGPROBS_PROVIDERS if op == "token_logprobs" else GRPO_LOSS_PROVIDERS
    return [p for p in PEERS if p in names and not all_rows(op, p)]


def recompute_bound(r: Result) -> tuple[bool, str]:
    """(does `recompute-floor` bind `r`, why). Measured: its extra memory is below half the float32 logits
    of the live rows (N_live·V·4 bytes), so it cannot be keeping them and must compute them twice. Not
    measured: the provider's static `recomputes` flag."""
    if r.extra_mib is not None and r.live_rows and "V" in r.shape:
        logits = r.live_rows * r.shape["V"] * 4 / 2**20
        lean = r.extra_mib < logits / 2
        return lean, f"extra {r.extra_mib:.0f} MiB {'<' if lean else '≥'} ½ of the {logits:.0f} MiB live logits"
    flag = _recomputes(r.op, r.provider)
    return flag, f"memory not measured; {'a' if flag else 'no'} recomputing provider"


def _same(results: list[Result], r: Result) -> list[Result]:
    return [b for b in results if (b.op, b.mode, b.shape, b.dtype) == (r.op, r.mode, r.shape, r.dtype)]


def _row(r, vs, quantity, ratio, target, verdict, kind="target"):
    # kind: "target" (counted pass / fail / not measured), "missing" (a peer with no figures: never a pass),
    # "info" (a peer doing more work, shown beside a live-row target, not compared)
    return dict(op=r.op, shape=shape_str(r.shape), candidate=r.provider, vs=vs, quantity=quantity,
                ratio=ratio, target=target, verdict=verdict, kind=kind)  # fmt: skip


def _measured(b: Result) -> bool:
    return b.status in ("ok", "ref") and bool(b.median_ms)


def _peer_rows(r: Result, group: dict, quantity: str) -> list[dict]:
    """Beside a peer target: a MISSING row, with its reason, for each live-row peer of the op that gave no
    figures (not run, n/a, error, wrong answer), and a labelled row for each all-rows peer that ran."""
    rows = []
    for name in live_row_peers(r.op):
        b = group.get(name)
        if b is None:
            rows.append(_row(r, name, quantity, None, "—", "MISSING (not run)", "missing"))
        elif not _measured(b):
            why = f"{b.status}: {b.note}" if b.note else b.status
            rows.append(_row(r, name, quantity, None, "—", f"MISSING ({why})", "missing"))
    for name, b in group.items():
        if name in PEERS and all_rows(r.op, name):
            label = f"{name} (all rows: more work)"
            why = "not compared: it scores every row, the ignored ones too"
            rows.append(_row(r, label, quantity, _ratio(r, b, quantity), "—", why, "info"))
    return rows


def _ratio(r: Result, b: Result | None, quantity: str) -> float | None:
    if b is None or not (r.measured and b.measured):
        return None
    if quantity == "time":
        return r.median_ms / b.median_ms if r.median_ms and b.median_ms else None
    return r.extra_mib / b.extra_mib if r.extra_mib is not None and b.extra_mib else None


def _unreachable(r: Result, group: dict, ref: Result, bound: float) -> str:
    # A time target below the candidate's own floor cannot be met by any correct run: say so next to the FAIL
    name = "recompute-floor" if recompute_bound(r)[0] and "recompute-floor" in group else "blas-floor"
    floor = group.get(name)
    if floor is None or not floor.median_ms or not ref.median_ms:
        return ""
    need = floor.median_ms / ref.median_ms
    if need <= bound:
        return ""
    return f" (unreachable here: {name} itself is {need:.3f}× {ref.provider})"


def _peer_refs(r: Result, group: dict, reference: str, quantity: str) -> list[tuple[str, Result | None]]:
    """(label, reference row) of a peer target over the measured live-row peers; a lone (label, None) when
    there is none to compare with (the row then says why, and is no pass)."""
    peers = [group[name] for name in live_row_peers(r.op) if name in group and _measured(group[name])]
    if not peers:
        return [("MISSING: no live-row peer measured", None)]
    if reference == "fastest-peer":
        best = min(peers, key=lambda b: b.median_ms)
        return [(f"fastest peer ({best.provider})", best)]
    eager = group.get("eager")
    if not (eager and eager.extra_mib):
        return [("peers ≤ ¼ eager's memory (eager's memory not measured)", None)]
    lean = [b for b in peers if b.extra_mib is not None and b.extra_mib <= eager.extra_mib * LEAN]
    return [(f"{b.provider} ({b.extra_mib:.0f} MiB ≤ ¼ eager's)", b) for b in lean]


def target_rows(results: list[Result], targets=TARGETS) -> list[dict]:
    rows = []
    for op, candidate, reference, quantity, bound in targets:
        for r in (x for x in results if x.op == op and x.provider == candidate):
            group = {b.provider: b for b in _same(results, r)}
            strict = reference == "lean-peers"
            target = f"< {bound:g}×" if strict else f"≤ {bound:g}×"
            if reference in ("fastest-peer", "lean-peers"):
                refs = _peer_refs(r, group, reference, quantity)
                if not refs:  # every live-row peer measured above the memory cap: nothing to be faster than
                    n = sum(1 for name in live_row_peers(op) if name in group and _measured(group[name]))
                    rows.append(_row(r, "peers ≤ ¼ eager's memory", quantity, None, "—",
                                     f"PASS (none of the {n} measured live-row peers is that lean)"))  # fmt: skip
            else:
                refs = [(reference, group.get(reference))]
            for label, b in refs:
                ratio = _ratio(r, b, quantity)
                if ratio is None:
                    why = f"{candidate} {r.status}, {label} {b.status if b else 'missing'}"
                    rows.append(_row(r, label, quantity, None, target, f"not measured ({why})"))
                    continue
                ok = ratio < bound if strict else ratio <= bound
                verdict = "PASS" if ok else "FAIL"
                if not ok and quantity == "time" and "floor" not in reference:
                    verdict += _unreachable(r, group, b, bound)
                rows.append(_row(r, label, quantity, ratio, target, verdict))
            if reference in ("fastest-peer", "lean-peers"):
                rows += _peer_rows(r, group, quantity)
    return rows


def floor_rows(results: list[Result]) -> list[dict]:
    """An ERROR row for every measured candidate faster than a floor it is bound by."""
    rows = []
    for f in (x for x in results if x.status == "floor" and x.median_ms):
        for r in _same(results, f):
            if r.status not in ("ok", "ref") or not r.median_ms:
                continue
            if f.provider == "blas-floor":
                bound, why = True, ""
            elif f.provider == "recompute-floor":
                bound, why = recompute_bound(r)
                why = f" ({why})"
            else:
                bound = False
            if bound and r.median_ms < f.median_ms:
                verdict = "ERROR: beats the floor" + why
                rows.append(_row(r, f.provider, "time", r.median_ms / f.median_ms, "≥ 1×", verdict))
    return rows


def verdict_line(rows: list[dict], errors: list[dict]) -> str:
    """PASS only when every target was measured and met, no floor was beaten and no peer is missing; FAIL when
    a target failed or was not measured, or a floor was beaten; INCOMPLETE when the targets pass but a peer gave
    no figures (the run did not compare fastrl with it: no pass)."""
    targets = [r for r in rows if r.get("kind", "target") == "target"]
    missing = [r["vs"] for r in rows if r.get("kind") == "missing"]
    passed = sum(r["verdict"].startswith("PASS") for r in targets)
    failed = sum(r["verdict"].startswith("FAIL") for r in targets)
    unmeasured = len(targets) - passed - failed
    word = "FAIL" if failed or unmeasured or errors else ("INCOMPLETE" if missing else "PASS")
    peers = f"{len(missing)} peer{'s' if len(missing) != 1 else ''} missing" + (
        f" ({', '.join(sorted(set(missing)))})" if missing else ""
    )
    return (
        f"**verdict: {word}** — {len(targets)} targets: {passed} pass, {failed} fail, {unmeasured} not measured; "
        f"{peers}; {len(errors)} floor error{'s' if len(errors) != 1 else ''} (a candidate faster than a floor)"
    )


def verdict_table(results: list[Result]) -> str:
    rows, errors = target_rows(results), floor_rows(results)
    out = ["\n" + verdict_line(rows, errors) + "\n", "**targets and floor checks**\n",
           "| op | shape | candidate | vs | quantity | ratio | target | verdict |", "|" + "---|" * 8]  # fmt: skip
    for r in rows + errors:
        ratio = "—" if r["ratio"] is None else f"{r['ratio']:.3f}×"
        cells = [r["op"], r["shape"], r["candidate"], r["vs"], r["quantity"], ratio, r["target"], r["verdict"]]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    """`python -m bench.verdict RUN.json [RUN.json ...]`: the targets, floor checks and verdict of saved runs
    (e.g. the two ops of --acceptance run as two processes), with each run's command and load."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m bench.verdict", description=main.__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    args = p.parse_args(argv)
    results = []
    for path in args.runs:
        with open(path) as f:
            data = json.load(f)
        env = data["environment"]
        if env.get("planted_slowdown"):
            from bench.plant import planted_lines

            print("\n".join(planted_lines(env["planted_slowdown"])))
        print(f"- `{env['command']}` at {env['timestamp_utc']}, git {env['git_sha']}, wall {env.get('wall_s')} s, "
              f"load {env['load_average_start']} → {env.get('load_average_end')}")  # fmt: skip
        results += [Result(**r) for r in data["results"]]
    print(verdict_table(results))
    rows, errors = target_rows(results), floor_rows(results)
    return 0 if verdict_line(rows, errors).startswith("**verdict: PASS") else 1


if __name__ == "__main__":
    raise SystemExit(main())
