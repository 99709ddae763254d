"""GPU check of grpo_loss against every peer, and of the no-grad log-probs, at long-context shapes.

    PYTHONPATH=. python scripts/gpu_check_loss.py             # one CUDA GPU, ≤ 10 min
    PYTHONPATH=. python scripts/gpu_check_loss.py --dry-run   # tiny shapes on CPU (Triton interpreter)

grpo_loss fwd+bwd (token-mean, β = 0.04, bf16) at B·T = 16k and 32k tokens, D = 4096, V = 151936, for
every provider of bench/providers.py (eager, torch.compile, fastrl gradient-in-forward with the Triton
epilogue and with the torch fold, fastrl recompute, TRL, Liger, the three-GEMM floor); each is checked
against eager first (bench/harness.py), and a peer that is not installed is listed as n/a. Then
token_logprobs under no_grad. Rates count 6·N·D·V FLOPs for the loss's fwd+bwd (the gradient-in-forward
work) and 2·N·D·V for the no-grad forward, against a bf16 torch.matmul of the same N·D·V measured in
the same run. Results go to $OUT/gpu_check_loss.json when OUT is set; the short table is printed last.
"""

import argparse
import json
import os
import sys

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU under TRITON_INTERPRET=1")
parser.add_argument("--reps", type=int, default=5)
ARGS = parser.parse_args()
if ARGS.dry_run:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.bench_grpo_loss import OP as LOSS  # noqa: E402
from bench.bench_token_logprobs import OP as LOGPROBS  # noqa: E402
from bench.harness import Settings, ShapeCache, matmul_tflops, run_group  # noqa: E402

DEVICE = torch.device("cpu" if ARGS.dry_run else "cuda")
DTYPE = "fp32" if ARGS.dry_run else "bf16"
LOSS_SHAPES = (
    [dict(B=2, T=32, D=64, V=512)]
    if ARGS.dry_run
    else [
        dict(B=16, T=1024, D=4096, V=151936),
        dict(B=32, T=1024, D=4096, V=151936),
    ]
)
LOGPROB_SHAPES = (
    [dict(N=64, D=64, V=512)]
    if ARGS.dry_run
    else [
        dict(N=16384, D=4096, V=151936),
        dict(N=32768, D=4096, V=151936),
    ]
)
LOSS_PROVIDERS = ["eager", "compile", "fastrl-triton", "fastrl-torch", "fastrl-recompute", "trl", "liger", "blas-floor"]
LOGPROB_PROVIDERS = ["eager", "fastrl-triton", "fastrl-torch", "trl", "cce"]


def ceiling(n, d, v):
    if DEVICE.type != "cuda":
        return None
    return matmul_tflops(n, d, v, DEVICE)


def main() -> int:
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device is visible to torch (use --dry-run on CPU)")
    settings = Settings(warmup=1, reps=ARGS.reps, budget_s=20.0, memory=DEVICE.type == "cuda")
    rows = []
    plan = [(LOSS, s, "fwd+bwd", LOSS_PROVIDERS, 6) for s in LOSS_SHAPES]
    plan += [(LOGPROBS, s, "fwd", LOGPROB_PROVIDERS, 2) for s in LOGPROB_SHAPES]
    for op, shape, mode, names, flop_x in plan:
        cache = ShapeCache()
        providers = [op.providers[n] for n in names]
        results = run_group(op, providers, shape, DTYPE, mode, DEVICE, settings, cache)
        n, d, v = op.matmul_dims(shape)
        rate = ceiling(n, d, v)
        for r in results:
            tflops = flop_x * n * d * v / (r.median_ms / 1e3) / 1e12 if r.median_ms else None
            pct = 100 * tflops / rate if tflops and rate else None
            rows.append(dict(r.to_json(), counted_tflops=tflops, pct_of_matmul=pct, matmul_tflops=rate, flop_x=flop_x))
            print(json.dumps(rows[-1]), flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_check_loss.json"), "w") as f:
            json.dump(rows, f, indent=1)
    print("\n| op | mode | tokens | provider | status | ms | extra MiB | TFLOP/s (counted) | % bf16 matmul |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        tokens = r["shape"].get("N") or r["shape"]["B"] * r["shape"]["T"]
        cells = [
            r["op"],
            r["mode"] + f" ({r['flop_x']}·NDV)",
            str(tokens),
            r["provider"],
            r["status"] + (f": {r['note'][:60]}" if r["note"] else ""),
            "—" if r["median_ms"] is None else f"{r['median_ms']:.1f}",
            "—" if r["extra_mib"] is None else f"{r['extra_mib']:.0f}",
            "—" if r["counted_tflops"] is None else f"{r['counted_tflops']:.0f}",
            "—" if r["pct_of_matmul"] is None else f"{r['pct_of_matmul']:.0f}",
        ]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
