"""The README's plot: `token_logprobs` fwd+bwd time and peak extra memory against tokens, fastrl and its peers.

    PYTHONPATH=. python -m bench.readme_plot                  # CPU, fp32, D=128, V=8192, N = 256 … 2048
    PYTHONPATH=. python -m bench.readme_plot --tokens 512,1024 --out docs/img/token_logprobs_cpu.png

Each point is the bench harness's (bench/harness.py `run_group`): every provider checked against the eager
reference first (a wrong one is FAIL and not drawn), timed in interleaved rounds, its peak memory measured in
a fresh process. The peers score the live rows (`on_live_rows`), as fastrl does. The caption under the title
names the command, the machine and its load average at the start and the end, since a shared machine's times
move with its load. Writes the PNG and, beside it, the JSON of the run.
"""

import argparse
import os
import shlex
import shutil
import sys
import tempfile

import torch

from bench import report
from bench.bench_token_logprobs import OP
from bench.harness import Settings, ShapeCache, environment, load_average, run_group

PROVIDERS = ("eager", "fastrl-torch", "torch-lce", "cce", "trl")
OUT = os.path.join("docs", "img", "token_logprobs_cpu.png")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.readme_plot", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="256,512,1024,2048", help="N values (tokens per call)")
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--V", type=int, default=8192)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--providers", default=",".join(PROVIDERS))
    p.add_argument("--out", default=OUT)
    p.add_argument("--from-json", default=None, help="redraw the plot of a run this script wrote (no measuring)")
    a = p.parse_args(argv)
    if a.from_json:
        return draw(*_load(a.from_json), a.out)
    device, settings = torch.device("cpu"), Settings(warmup=0, reps=a.reps, budget_s=10.0, memory=True)
    env = environment(device)
    env["machine"] = f"{env['device']}, torch {torch.__version__}"
    command = "PYTHONPATH=. python -m bench.readme_plot " + shlex.join(argv if argv is not None else sys.argv[1:])
    providers = [OP.providers[n] for n in a.providers.split(",")]
    results = []
    for n in (int(x) for x in a.tokens.split(",")):
        group = run_group(OP, providers, dict(N=n, D=a.D, V=a.V), "fp32", "fwd+bwd", device, settings, ShapeCache())
        for r in group:
            print(f"N={n} {r.provider:13s} {r.status:5s} {r.median_ms} ms {r.extra_mib} MiB {r.note}", flush=True)
        results += group
    env.update(command=command, load=f"load {env['load_average_start']} → {load_average()}")
    report.write_json(os.path.splitext(a.out)[0] + ".json", env, results)
    return draw(env, results, a.out)


def _load(path: str):
    import json

    from bench.harness import Result

    with open(path) as f:
        data = json.load(f)
    return data["environment"], [Result(**r) for r in data["results"]]


def draw(env: dict, results: list, out: str) -> int:
    """The PNG of a run's results, its caption on three lines: op and shape, machine and load, command."""
    wrong = [f"{r.provider} N={r.shape['N']}: {r.status} {r.note}" for r in results if r.status in ("FAIL", "error")]
    absent = sorted({f"{r.provider} ({r.note})" for r in results if r.status == "n/a"})
    caption = f"{env['machine']}, {env['timestamp_utc'][:10]}\n{env['load']}" + (
        f"; n/a: {', '.join(absent)}" if absent else ""
    )
    caption += f"\n{env['command'].strip()}"
    with tempfile.TemporaryDirectory() as tmp:
        pngs = report.plot(results, tmp, caption)
        if len(pngs) != 1:
            raise SystemExit(f"expected one plot, got {pngs}: too few points measured ({wrong})")
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        shutil.copyfile(pngs[0], out)
    print(f"wrote {out}\ncaption: {caption}")
    if wrong:
        print("not drawn: " + "; ".join(wrong), file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
