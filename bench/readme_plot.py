"""The README's figure: `token_logprobs` and `grpo_loss` fwd+bwd time and peak extra memory against tokens at
Qwen2.5-0.5B's LM head (D = 896, V = 151,936), fastrl and its peers, on the CPU.

    PYTHONPATH=. python -m bench.readme_plot                      # the README's run (an hour and more on 2 cores)
    PYTHONPATH=. python -m bench.readme_plot --from-json docs/img/readme_bench_cpu.json   # redraw, no measuring

Each point is the bench harness's (bench/harness.py `run_group`, through bench/readme_sweep.py): every provider
checked against a reference first (eager where it fits the process limit, else the eager reference in row blocks;
a wrong one is FAIL and not drawn), timed, its peak memory measured in a fresh process. The whole run is under
`RLIMIT_AS` = `--limit-gib`; a provider that keeps the logits is not started where its predicted need passes
it, and none is started at a point where one call is predicted past `--max-call-s`. Points not run are drawn
as such (eager's with its predicted need), never as measured. The caption names the command, the machine and
its load at the start and the end. Writes the PNG and, beside it, the JSON of the run after every point.
"""

import argparse
import json
import os
import shlex
import sys
import textwrap
import time

import torch

from bench import report
from bench.harness import Result, environment, load_average
from bench.readme_sweep import GIB, LOGIT_FACTOR, OPS, limit_address_space, predicted_bytes, sweep

PROVIDERS = {
    "token_logprobs": "eager,fastrl-torch,trl,cce",
    "grpo_loss": "eager,fastrl-torch,trl,liger,cce",
}
OUT = os.path.join("docs", "img", "readme_bench_cpu.png")
STYLE = {
    "eager": ("tab:orange", "o"),
    "fastrl-torch": ("tab:green", "s"),
    "trl": ("tab:gray", "^"),
    "liger": ("tab:brown", "v"),
    "cce": ("tab:purple", "D"),
    "torch-lce": ("tab:blue", "P"),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.readme_plot", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="1024,2048,4096,8192,16384,32768", help="token counts, smallest first")
    p.add_argument("--D", type=int, default=896)
    p.add_argument("--V", type=int, default=151936)
    p.add_argument(
        "--reps",
        type=int,
        default=2,
        help="calls per point below 4,096 tokens (the first is also checked and measured for memory); one from there",
    )
    p.add_argument("--token-logprobs-providers", default=PROVIDERS["token_logprobs"])
    p.add_argument("--grpo-loss-providers", default=PROVIDERS["grpo_loss"])
    p.add_argument("--limit-gib", type=float, default=8.0, help="RLIMIT_AS of the run and its memory children")
    p.add_argument("--max-call-s", type=float, default=360.0, help="skip a provider whose call is predicted longer")
    p.add_argument("--max-tokens", default="", help="PROVIDER=N,...: run a provider at N tokens at most")
    p.add_argument("--budget-min", type=float, default=80.0, help="start no point after this many minutes")
    p.add_argument("--note", default="", help="a line for the caption: what else ran on the machine")
    p.add_argument("--out", default=OUT)
    p.add_argument("--from-json", default=None, help="redraw the figure of a run this script wrote (no measuring)")
    a = p.parse_args(argv)
    if a.from_json:
        with open(a.from_json) as f:
            data = json.load(f)
        return draw(data["environment"], [Result(**r) for r in data["results"]], a.out)
    tokens = [int(x) for x in a.tokens.split(",")]
    if tokens != sorted(tokens) or tokens[0] <= 0:
        raise SystemExit(f"--tokens must be positive and increasing, got {a.tokens}")
    providers = {"token_logprobs": a.token_logprobs_providers.split(","), "grpo_loss": a.grpo_loss_providers.split(",")}
    for op_name, names in providers.items():
        unknown = [n for n in names if n not in OPS[op_name].providers]
        if unknown:
            raise SystemExit(f"unknown {op_name} providers {unknown}; known: {sorted(OPS[op_name].providers)}")
    try:
        max_tokens = {k: int(n) for k, n in (item.split("=") for item in a.max_tokens.split(",") if item)}
    except ValueError:
        raise SystemExit(f"--max-tokens takes PROVIDER=N,..., got {a.max_tokens!r}") from None
    limit = int(a.limit_gib * GIB)
    limit_address_space(limit)
    env = environment(torch.device("cpu"))
    env.update(
        machine=f"{env['device']}, torch {torch.__version__}",
        command="PYTHONPATH=. python -m bench.readme_plot " + shlex.join(argv if argv is not None else sys.argv[1:]),
        limit_gib=a.limit_gib,
        max_call_s=a.max_call_s,
        max_tokens=max_tokens,
        note=a.note,
        references={},
        eager_need_gib={str(n): predicted_bytes("eager", n, a.D, a.V) / GIB for n in tokens},
    )
    json_path = os.path.splitext(a.out)[0] + ".json"
    os.makedirs(os.path.dirname(json_path) or ".", exist_ok=True)
    results: list[Result] = []

    def on_point(rows: list[Result], reference: str) -> None:
        for r in rows:
            print(f"{r.op} {report.tokens(r.shape)} {r.provider:13s} {r.status:7s} {r.median_ms} ms "
                  f"{r.extra_mib} MiB {r.note}", flush=True)  # fmt: skip
        results.extend(rows)
        env["references"][f"{rows[0].op} {report.tokens(rows[0].shape)}"] = reference
        env["load"] = f"load {env['load_average_start']} → {load_average()}"
        report.write_json(json_path, env, results)

    limits, stop_by = (limit, a.max_call_s, max_tokens), time.time() + 60 * a.budget_min
    sweep(list(OPS), providers, tokens, a.D, a.V, limits, a.reps, stop_by, on_point)
    env["timestamp_end_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report.write_json(json_path, env, results)
    return draw(env, results, a.out)


def _panel(ax, rows: list[Result], value: str, ylabel: str) -> None:
    for name in dict.fromkeys(r.provider for r in rows):
        color, marker = STYLE.get(name, ("black", "."))
        pts = sorted((report.tokens(r.shape), getattr(r, value)) for r in rows if r.provider == name and r.measured)
        pts = [(x, y) for x, y in pts if y is not None]
        if pts:
            ax.plot(*zip(*pts), color=color, marker=marker, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens (N)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)


def draw(env: dict, results: list[Result], out: str) -> int:
    """Two rows (token_logprobs, grpo_loss) x (time, peak extra memory); eager's predicted need where it was not
    run, the process limit as a line; the caption lists what was not measured and why."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 10))
    limit_mib = env["limit_gib"] * 1024
    planned = [int(n) for n in env["eager_need_gib"]]
    for row, op_name in enumerate(OPS):
        rows = [r for r in results if r.op == op_name]
        for r in rows:
            r.median_s = None if r.median_ms is None else r.median_ms / 1e3
        _panel(axes[row][0], rows, "median_s", f"{op_name} fwd+bwd: seconds per call")
        _panel(axes[row][1], rows, "extra_mib", f"{op_name} fwd+bwd: peak extra memory, MiB")
        ax = axes[row][1]
        ax.axhline(limit_mib, color="red", linestyle=":", linewidth=1)
        ax.text(planned[0], limit_mib * 0.85, f"process limit {env['limit_gib']:.0f} GiB (shared 24 GB machine)",
                fontsize=8, va="top")  # fmt: skip
        over = [int(n) for n, gib in env["eager_need_gib"].items() if gib > env["limit_gib"]]
        if over:
            need = [env["eager_need_gib"][str(n)] * 1024 for n in over]
            ax.plot(over, need, color=STYLE["eager"][0], marker="x", linestyle="none", markersize=10,
                    label="eager: predicted need, not run")  # fmt: skip
            ax.annotate("eager: out of memory (over the limit) from here", (over[0], need[0]),
                        textcoords="offset points", xytext=(-60, 14), fontsize=8)  # fmt: skip
        for a in axes[row]:
            a.set_xlim(planned[0] / 1.3, planned[-1] * 1.3)
            if a.get_legend_handles_labels()[0]:
                a.legend(fontsize=8, framealpha=0.5)  # the lines under it stay visible
    wrong = [f"{r.op} {r.provider} {report.tokens(r.shape)}: {r.status} {r.note}" for r in results
             if r.status in ("FAIL", "error", "OOM")]  # fmt: skip
    caption = _caption(env, results)
    d, v = _dim(results, "D"), _dim(results, "V")
    head = " (Qwen2.5-0.5B's LM head)" if (d, v) == (896, 151936) else ""
    fig.suptitle(f"fp32 fwd+bwd at D = {d}, V = {v:,}{head}, against tokens")
    fig.text(0.01, 0.005, caption, fontsize=7, va="bottom", family="monospace")
    fig.tight_layout(rect=(0, 0.03 + 0.017 * caption.count("\n"), 1, 0.97))
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.savefig(out, dpi=90)
    print(f"wrote {out}\ncaption:\n{caption}")
    if wrong:
        print("not drawn: " + "; ".join(wrong), file=sys.stderr)
    return 1 if wrong else 0


def _dim(results: list[Result], key: str) -> int:
    return results[0].shape[key]


def _caption(env: dict, results: list[Result]) -> str:
    blocked = sorted(k for k, v in env["references"].items() if v == "eager in row blocks")
    by_provider: dict[tuple, list[str]] = {}
    for r in results:
        if r.status == "skipped":
            reason = r.note.split(" (predicted")[0].split(": a call predicted")[0]
            by_provider.setdefault((r.op, r.provider, reason), []).append(str(report.tokens(r.shape)))
    skipped: dict[tuple, list[str]] = {}  # (op, token counts, reason) -> providers
    for (op_name, provider, reason), ns in by_provider.items():
        skipped.setdefault((op_name, ", ".join(ns), reason), []).append(provider)
    lines = [
        f"{env['machine']}, {env['timestamp_utc'][:16]} UTC; {env['load']}"
        + (f" ({env['note']})" if env.get("note") else ""),
        f"checked against eager; eager in row blocks (fp32, same inputs) at {', '.join(blocked) or 'no point'}",
    ]
    over = [n for n, gib in env["eager_need_gib"].items() if gib > env["limit_gib"]]
    if over:
        factor = LOGIT_FACTOR["eager"]
        lines.append(f"x: eager's predicted need at N = {', '.join(over)} (N x V x 4 B x {factor:g}, plus the inputs "
                     f"and their gradients), past the {env['limit_gib']:.0f} GiB limit: not run")  # fmt: skip
    lines += [f"not run at N = {ns}: {op_name} {', '.join(ps)}: {why}" for (op_name, ns, why), ps in skipped.items()]
    for op_name in OPS:
        reached = {report.tokens(r.shape) for r in results if r.op == op_name}
        left = [n for n in env["eager_need_gib"] if int(n) not in reached]
        if left:
            lines.append(f"not measured at N = {', '.join(left)}: {op_name}, the run was stopped before them")
    lines.append(env["command"].strip())
    return "\n".join(textwrap.fill(line, 170, subsequent_indent="    ") for line in lines)


if __name__ == "__main__":
    raise SystemExit(main())
