"""Both ops against every peer on the live rows, at long-context shapes (part of `python -m bench.gpu`).

grpo_loss fwd+bwd (token-mean, β = 0.04, bf16) at B·T = 16k and 32k tokens, D = 4096, V = 151936, and
token_logprobs fwd+bwd at N = 16k, for every provider of bench/providers_grpo.py / bench/providers.py (eager
and torch.compile on the live rows, fastrl with the Triton kernels and with the torch fold, fastrl
recompute, TRL on the live rows, Liger, Cut Cross-Entropy, PyTorch's chunked linear_cross_entropy, the GEMM
floors); each is checked against eager first (bench/harness.py), and a peer that is not installed is
listed as n/a. Rates count 6·N·D·V FLOPs for the loss (the gradient-in-forward work) and 8·N·D·V for the
log-prob op's fwd+bwd, against a bf16 torch.matmul of the same N·D·V measured in the same run.
"""

import json

import torch

from bench.bench_grpo_loss import OP as LOSS
from bench.bench_token_logprobs import OP as LOGPROBS
from bench.harness import Settings, ShapeCache, matmul_tflops, run_group

LOSS_PROVIDERS = ["eager", "compile", "fastrl-triton", "fastrl-torch", "fastrl-recompute", "trl", "liger", "cce",
                  "torch-lce", "blas-floor"]  # fmt: skip
LOGPROB_PROVIDERS = ["eager", "fastrl-triton", "fastrl-torch", "trl", "cce", "torch-lce", "blas-floor",
                     "recompute-floor"]  # fmt: skip


def shapes(dry_run: bool):
    if dry_run:
        return [dict(B=2, T=32, D=64, V=512)], [dict(N=64, D=64, V=512)]
    return [dict(B=16, T=1024, D=4096, V=151936), dict(B=32, T=1024, D=4096, V=151936)], [
        dict(N=16384, D=4096, V=151936)
    ]


def main(dry_run: bool, reps: int = 5) -> dict:
    device = torch.device("cpu" if dry_run else "cuda")
    dtype = "fp32" if dry_run else "bf16"
    settings = Settings(warmup=1, reps=reps, budget_s=20.0, memory=device.type == "cuda")
    loss_shapes, logprob_shapes = shapes(dry_run)
    plan = [(LOSS, s, LOSS_PROVIDERS, 6) for s in loss_shapes]
    plan += [(LOGPROBS, s, LOGPROB_PROVIDERS, 8) for s in logprob_shapes]
    rows = []
    for op, shape, names, flop_x in plan:
        cache = ShapeCache()
        results = run_group(op, [op.providers[n] for n in names], shape, dtype, "fwd+bwd", device, settings, cache)
        n, d, v = op.matmul_dims(shape)
        rate = matmul_tflops(n, d, v, device) if device.type == "cuda" else None
        for r in results:
            tflops = flop_x * n * d * v / (r.median_ms / 1e3) / 1e12 if r.median_ms else None
            pct = 100 * tflops / rate if tflops and rate else None
            rows.append(dict(r.to_json(), counted_tflops=tflops, pct_of_matmul=pct, matmul_tflops=rate, flop_x=flop_x))
            print(json.dumps(rows[-1]), flush=True)
    lines = ["| op | tokens | provider | status | ms | extra MiB | TFLOP/s (counted) | % bf16 matmul |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        tokens = r["shape"].get("N") or r["shape"]["B"] * r["shape"]["T"]
        cells = [
            f"{r['op']} ({r['flop_x']}·NDV)", str(tokens), r["provider"],
            r["status"] + (f": {r['note'][:60]}" if r["note"] else ""),
            "—" if r["median_ms"] is None else f"{r['median_ms']:.1f}",
            "—" if r["extra_mib"] is None else f"{r['extra_mib']:.0f}",
            "—" if r["counted_tflops"] is None else f"{r['counted_tflops']:.0f}",
            "—" if r["pct_of_matmul"] is None else f"{r['pct_of_matmul']:.0f}",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    bad = [r for r in rows if r["status"] in ("FAIL", "error") and r["provider"].startswith("fastrl")]
    return {"rows": rows, "table": "\n".join(lines), "pass": not bad}
