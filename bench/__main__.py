"""`python -m bench`: run the benchmark sweeps and write tables, JSON and plots.

    python -m bench --device cpu --quick            # ≤ 3 min on 2 cores: smoke sweep + memory scaling
    python -m bench --device cpu                    # full CPU sweep (fp32), tens of minutes
    python -m bench --device cpu --acceptance       # headline points: N=8192 D=512 V=32768 fp32 fwd+bwd
    python -m bench --device cpu --acceptance --plant-slowdown 0.15   # fastrl 15% slower: must FAIL
    PYTHONPATH=. python -m bench --device cuda      # one H200: bf16 sweep, ≤ 5 min (see --budget-s)

Every provider is first checked against the eager reference in the same run; a failed check is shown
as FAIL with no figures. Output: the tables on stdout and, in --out, results.json, results.md and PNGs.
"""

import argparse
import importlib
import os
import subprocess
import sys
import time

import torch

from bench import floors as floor_tiles
from bench import report
from bench.harness import Result, Settings, ShapeCache, environment, load_average, run_group
from bench.plant import planted_lines, planted_slowdown

OPS = ("token_logprobs", "grpo_loss")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="small CPU shapes, fewer repetitions")
    p.add_argument(
        "--acceptance",
        action="store_true",
        help="only the headline CPU configurations, checked against their memory/time targets",
    )
    p.add_argument("--out", default=os.path.join("bench", "out"), help="directory for JSON, markdown, PNGs")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {OPS}")
    p.add_argument("--providers", default="", help="comma-separated subset of providers (default: all)")
    p.add_argument("--reps", type=int, default=None, help="timed calls per configuration")
    p.add_argument(
        "--budget-s", type=float, default=None, help="stop starting configurations after this long (split over ops)"
    )
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--rewards", action="store_true", help="also run bench/bench_rewards.py (verifier throughput)")
    p.add_argument(
        "--plant-slowdown",
        type=float,
        default=None,
        metavar="F",
        help="slow every call of fastrl's chunked kernels by F × its own time (a test of the verdict; the "
        "report and the file names say so)",
    )
    return p.parse_args(argv)


def settings_for(args, device: torch.device) -> tuple[Settings, float]:
    """(per-configuration settings, whole-run budget in seconds)."""
    if device.type == "cuda":
        s, budget = Settings(warmup=2, reps=10, budget_s=2.0), 210.0
    elif args.acceptance:
        s, budget = Settings(warmup=0, reps=5, budget_s=120.0), float("inf")
    elif args.quick:
        s, budget = Settings(warmup=0, reps=3, budget_s=3.0), float("inf")
    else:
        s, budget = Settings(warmup=1, reps=5, budget_s=20.0), float("inf")
    if args.reps is not None:
        s = Settings(warmup=s.warmup, reps=args.reps, budget_s=s.budget_s, memory=s.memory)
    if args.no_memory:
        s = Settings(warmup=s.warmup, reps=s.reps, budget_s=s.budget_s, memory=False)
    return s, budget if args.budget_s is None else args.budget_s


def load_ops(names: list[str]) -> list:
    ops = []
    for name in names:
        if name not in OPS:
            raise SystemExit(f"unknown op {name!r}; choose from {OPS}")
        try:
            ops.append(importlib.import_module(f"bench.bench_{name}").OP)
        except ImportError as exc:  # e.g. the loss is not in this checkout yet
            print(f"[bench] skipping {name}: {exc}", file=sys.stderr)
    return ops


def progress(r: Result, seconds: float) -> None:
    timing = f"{r.median_ms:9.1f} ms" if r.median_ms is not None else " " * 12
    mem = f"{r.extra_mib:8.0f} MiB" if r.extra_mib is not None else ""
    note = f"  {r.note}" if r.note else ""
    print(
        f"[{seconds:6.1f}s] {r.op:15s} {r.mode:8s} {report.shape_str(r.shape):24s} {r.dtype} "
        f"{r.provider:14s} {r.status:7s}{timing} {mem}{note}",
        flush=True,
    )


def run(args) -> tuple[dict, list[Result]]:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible to torch")
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("[bench] TRITON_INTERPRET=1 is set: the Triton provider will be reported n/a", file=sys.stderr)
    settings, budget = settings_for(args, device)
    wanted = [p for p in args.providers.split(",") if p]
    env = environment(device)
    results: list[Result] = []
    start = time.perf_counter()
    ops = load_ops([o for o in args.ops.split(",") if o])
    shares = sum(op.budget_share for op in ops)
    for op in ops:
        cache = ShapeCache()
        op_start, op_budget = time.perf_counter(), budget * op.budget_share / shares
        for shape, dtype, names, modes in op.plan(device, args.quick, args.acceptance):
            providers = [op.providers[n] for n in names if not wanted or n in wanted]
            for mode in modes:
                if time.perf_counter() - op_start > op_budget:
                    note = f"{op.name}'s share of the run budget ({op_budget:.0f} s) is spent"
                    group = [Result(op.name, p.name, mode, dict(shape), dtype, "skipped", note) for p in providers]
                else:
                    # in --quick on CPU, memory only where it is cheap: fwd+bwd, no per-child compile
                    quick_cpu = args.quick and device.type == "cpu"

                    def memory_for(p, mode=mode, quick_cpu=quick_cpu):
                        return not (quick_cpu and (mode != "fwd+bwd" or p.compiles))

                    group = run_group(op, providers, shape, dtype, mode, device, settings, cache, memory_for)
                for r in group:
                    results.append(r)
                    progress(r, time.perf_counter() - start)
    env["wall_s"] = round(time.perf_counter() - start, 1)
    env["floor_tilings"] = {" ".join(map(str, k)): list(v) for k, v in floor_tiles.CHOSEN.items()}
    env["load_average_end"] = load_average()
    return env, results


def render(env: dict, results: list[Result], args) -> str:
    gpu = env["device_type"] == "cuda"
    lines = planted_lines(env["planted_slowdown"]) if env.get("planted_slowdown") else []
    lines += [
        f"- date: {env['timestamp_utc']}",
        f"- device: {env['device']}",
        f"- torch {env['torch']}, triton {env['triton']}, python {env['python']}, git {env['git_sha']}",
        f"- command: `{env['command']}`  (wall {env['wall_s']} s)",
        f"- load average (1/5/15 min) at start: {env['load_average_start']}, at end: {env['load_average_end']}",
    ]
    if env.get("fastrl_env"):
        lines.append(f"- environment: {' '.join(f'{k}={v}' for k, v in env['fastrl_env'].items())}")
    scaling = ["eager", "fastrl-torch"] + (["fastrl-triton"] if gpu else [])
    ops = sorted({r.op for r in results})
    body = [report.sweep_table(results, "eager", gpu)]
    for op in ops:
        mode = "fwd+bwd"
        if any(r.op == op and r.mode == mode and r.extra_mib is not None for r in results):
            body.append(report.memory_scaling_table(results, op, mode, scaling))
    if args.acceptance:
        from bench.verdict import verdict_table

        body.insert(0, verdict_table(results))
        if floor_tiles.CHOSEN:
            lines.append(floor_tiles.tilings_line())
    return "\n".join(lines) + "\n" + "\n".join(body) + "\n"


def run_rewards(out_dir: str) -> str:
    """The math verifier's benchmark, in its own process; its printed summary, as markdown."""
    cmd = [sys.executable, "-m", "bench.bench_rewards", "--out", os.path.join(out_dir, "rewards.json")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return "\n**rewards**: bench_rewards did not finish in 600 s\n"
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        return f"\n**rewards**: bench_rewards exited {proc.returncode}: {tail}\n"
    return "\n**rewards — math verifier (`python -m bench.bench_rewards`)**\n\n```\n" + proc.stdout.strip() + "\n```\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plant_slowdown is None:
        env, results = run(args)
    else:
        with planted_slowdown(args.plant_slowdown) as record:
            env, results = run(args)
        env["planted_slowdown"] = record
    os.makedirs(args.out, exist_ok=True)
    text = render(env, results, args)
    if args.rewards:
        text += run_rewards(args.out)
    print("\n" + text)
    stem = ("acceptance" if args.acceptance else ("quick" if args.quick else "full")) + (
        "_planted" if args.plant_slowdown is not None else ""
    )
    base = os.path.join(args.out, f"{env['device_type']}_{stem}")
    report.write_json(base + ".json", env, results)
    with open(base + ".md", "w") as f:
        f.write(text)
    pngs = report.plot(results, args.out, f"{env['device']}, {env['timestamp_utc']}")
    print(f"wrote {base}.json, {base}.md" + "".join(f", {p}" for p in pngs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
