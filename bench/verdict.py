"""The --acceptance targets, the floor checks and the one-line verdict that counts their failures.

A target compares fastrl's row with a reference row of the same (op, mode, shape, dtype): eager, a floor,
the fastest correct peer of the run, or each peer lean enough in memory. A floor beaten by any candidate
it binds is an ERROR, not a pass: the floor, or the candidate's correctness, is then wrong. `blas-floor`
binds every provider; `recompute-floor` the ones that must recompute the logits (`recompute_bound`: extra
memory below half the live rows' float32 logits, or, unmeasured, the provider's `recomputes` flag). A
target whose rows were not measured counts as a failure too, so the verdict passes only when every target
was measured and met.
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


def _recomputes(op: str, provider: str) -> bool:
    if op == "token_logprobs":
        p = TOKEN_LOGPROBS_PROVIDERS.get(provider)
    else:
        from bench.providers_grpo import GRPO_LOSS_PROVIDERS

        p = GRPO_LOSS_PROVIDERS.get(provider)
    return bool(p and p.recomputes)


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


def _row(r, vs, quantity, ratio, target, verdict):
    return dict(op=r.op, shape=shape_str(r.shape), candidate=r.provider, vs=vs, quantity=quantity,
                ratio=ratio, target=target, verdict=verdict)  # fmt: skip


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


def target_rows(results: list[Result], targets=TARGETS) -> list[dict]:
    rows = []
    for op, candidate, reference, quantity, bound in targets:
        for r in (x for x in results if x.op == op and x.provider == candidate):
            group = {b.provider: b for b in _same(results, r)}
            peers = [b for name, b in group.items() if name in PEERS and b.status in ("ok", "ref") and b.median_ms]
            if reference == "fastest-peer":
                best = min(peers, key=lambda b: b.median_ms, default=None)
                refs = [(f"fastest peer ({best.provider})" if best else "fastest peer (none measured)", best)]
            elif reference == "lean-peers":
                eager = group.get("eager")
                cap = eager.extra_mib * LEAN if eager and eager.extra_mib else None
                lean = [b for b in peers if cap is not None and b.extra_mib is not None and b.extra_mib <= cap]
                refs = [(f"{b.provider} ({b.extra_mib:.0f} MiB ≤ ¼ eager's)", b) for b in lean]
                if cap is None:
                    refs = [("peers ≤ ¼ eager's memory (eager's memory not measured)", None)]
                elif not lean:
                    rows.append(_row(r, "peers ≤ ¼ eager's memory", quantity, None, "—", "PASS (no such peer)"))
            else:
                refs = [(reference, group.get(reference))]
            for label, b in refs:
                ratio = _ratio(r, b, quantity)
                strict = reference == "lean-peers"
                target = f"< {bound:g}×" if strict else f"≤ {bound:g}×"
                if ratio is None:
                    why = f"{candidate} {r.status}, {label} {b.status if b else 'missing'}"
                    rows.append(_row(r, label, quantity, None, target, f"not measured ({why})"))
                    continue
                ok = ratio < bound if strict else ratio <= bound
                verdict = "PASS" if ok else "FAIL"
                if not ok and quantity == "time" and "floor" not in reference:
                    verdict += _unreachable(r, group, b, bound)
                rows.append(_row(r, label, quantity, ratio, target, verdict))
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
    passed = sum(r["verdict"].startswith("PASS") for r in rows)
    failed = sum(r["verdict"].startswith("FAIL") for r in rows)
    unmeasured = len(rows) - passed - failed
    ok = failed == 0 and unmeasured == 0 and not errors
    return (
        f"**verdict: {'PASS' if ok else 'FAIL'}** — {len(rows)} targets: {passed} pass, {failed} fail, "
        f"{unmeasured} not measured; {len(errors)} floor error{'s' if len(errors) != 1 else ''} "
        "(a candidate faster than a floor)"
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
