"""GPU check of the Triton token-log-prob kernels: correctness at real shapes, then timings (`python -m bench.gpu`).

Correctness: impl="triton" in bf16 against a float64 ground truth (or, where N·V > 2^31, a chunked
float32 one), every output and gradient no worse than eager bf16 plus a bf16 tolerance (the rule of
tests/kernels). Timings: median of CUDA-event times for fwd and fwd+bwd at N in {4k, 16k, 32k},
D = 4096, V = 152064, against eager PyTorch and a bf16 torch.matmul of the same N·D·V (the ceiling),
counting 2·N·D·V FLOPs for fwd and 8·N·D·V for fwd+bwd. A speed is given only for a shape whose
correctness check passed. `--dry-run`: tiny shapes on CPU through the Triton interpreter (the caller sets
TRITON_INTERPRET=1 before torch and triton are imported).
"""

import os
import statistics
import subprocess
import time
from types import SimpleNamespace

import torch
import triton

import fastrl
from fastrl.kernels import LogprobParams, token_logprobs_reference
from fastrl.kernels.logprobs import bwd as logprob_bwd

ARGS = SimpleNamespace(dry_run=True, autotune=False, reps=1)
DEVICE = torch.device("cpu")
BF16_TOL = 4e-3  # one bf16 ulp, relative to the scale of the value compared (as in tests/kernels)
RESULTS = {"correctness": [], "timings": []}


def rel_err(x, ref):
    return ((x.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-12)).item()


def inputs(n, d, v, dtype, bias, seed=0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    hidden = torch.randn(n, d, device=DEVICE, generator=gen).to(dtype)
    weight = (torch.randn(v, d, device=DEVICE, generator=gen) * (2.0 / d**0.5)).to(dtype)
    b = (torch.randn(v, device=DEVICE, generator=gen) * 0.5).to(dtype) if bias else None
    targets = torch.randint(0, v, (n,), device=DEVICE, generator=gen)
    targets[torch.rand(n, device=DEVICE, generator=gen) < 0.1] = -100
    return hidden, weight, b, targets


def run(impl, hidden, weight, bias, targets, temperature, g, e, cast=None):
    """Outputs and gradients as a dict; impl None = eager reference; `cast` converts the leaves first."""
    leaves = [
        None if t is None else (t.to(cast) if cast else t).detach().requires_grad_() for t in (hidden, weight, bias)
    ]
    h, w, b = leaves
    if impl is None:
        logp, ent = token_logprobs_reference(h, w, targets, b, LogprobParams(temperature, -100, True))
    else:
        logp, ent = fastrl.token_logprobs(
            h, w, targets, bias=b, temperature=temperature, return_entropy=True, impl=impl
        )
    loss = (logp * g.to(logp.dtype)).sum() + (ent * e.to(ent.dtype)).sum()
    grads = torch.autograd.grad(loss, [t for t in leaves if t is not None])
    out = {"logp": logp.detach(), "entropy": ent.detach(), "d_hidden": grads[0], "d_weight": grads[1]}
    if b is not None:
        out["d_bias"] = grads[2]
    return out


def check(n, d, v, bias, temperature, truth):
    t0 = time.time()
    hidden, weight, b, targets = inputs(n, d, v, torch.bfloat16, bias)
    g, e = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
    got = run("triton", hidden, weight, b, targets, temperature, g, e)
    if truth == "fp64":
        ref = run(None, hidden, weight, b, targets, temperature, g, e, cast=torch.float64)
    else:
        ref = run("torch", hidden, weight, b, targets, temperature, g, e, cast=torch.float32)
    try:
        eager = run(None, hidden, weight, b, targets, temperature, g, e)
    except torch.OutOfMemoryError:
        eager = None
    row = {"N": n, "D": d, "V": v, "bias": bias, "temperature": temperature, "truth": truth, "errors": {}}
    ok = True
    for name, r in ref.items():
        err = rel_err(got[name], r)
        err_eager = rel_err(eager[name], r) if eager is not None else None
        passed = bool(torch.isfinite(got[name]).all()) and err <= (err_eager or 0.0) + BF16_TOL
        row["errors"][name] = {"triton": err, "eager": err_eager, "pass": passed}
        ok &= passed
    row["pass"], row["seconds"] = ok, round(time.time() - t0, 2)
    if DEVICE.type == "cuda":
        row["out_dtype_gemm"] = logprob_bwd._OUT_DTYPE_MM.get("cuda", "not used")
    RESULTS["correctness"].append(row)
    print(f"check N={n} D={d} V={v} bias={bias} t={temperature} truth={truth}: {'PASS' if ok else 'FAIL'}", flush=True)
    for name, errs in row["errors"].items():
        eag = "n/a" if errs["eager"] is None else f"{errs['eager']:.2e}"
        print(f"    {name:9s} triton {errs['triton']:.2e}  eager {eag}  {'ok' if errs['pass'] else 'FAIL'}")
    del got, ref, eager
    return ok


def timed(fn, reps):
    """Median milliseconds of fn() after two warm-up calls, or None on out-of-memory."""
    try:
        for _ in range(2):
            fn()
        times = []
        for _ in range(reps):
            if DEVICE.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - t0))
        return statistics.median(times)
    except torch.OutOfMemoryError:
        return None
    finally:
        if DEVICE.type == "cuda":
            torch.cuda.empty_cache()


def peak_mib(fn):
    if DEVICE.type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    try:
        fn()
    except torch.OutOfMemoryError:
        return None
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def bench(n, d, v, reps):
    hidden, weight, _, targets = inputs(n, d, v, torch.bfloat16, False)
    g = torch.randn(n, device=DEVICE)
    hidden.requires_grad_()
    weight.requires_grad_()

    def fwd(impl):
        with torch.no_grad():
            if impl is None:
                token_logprobs_reference(hidden, weight, targets)
            else:
                fastrl.token_logprobs(hidden, weight, targets, impl=impl)

    def fwd_bwd(impl):
        if impl is None:
            logp, _ = token_logprobs_reference(hidden, weight, targets)
        else:
            logp = fastrl.token_logprobs(hidden, weight, targets, impl=impl)
        torch.autograd.grad((logp * g).sum(), [hidden, weight])

    w_t = weight.detach().t()
    h = hidden.detach()
    row = {"N": n, "D": d, "V": v}
    row["matmul_ms"] = timed(lambda: h @ w_t, reps)
    row["triton_fwd_ms"] = timed(lambda: fwd("triton"), reps)
    row["triton_fwd_bwd_ms"] = timed(lambda: fwd_bwd("triton"), reps)
    row["eager_fwd_ms"] = timed(lambda: fwd(None), reps)
    row["eager_fwd_bwd_ms"] = timed(lambda: fwd_bwd(None), reps)
    row["triton_fwd_bwd_peak_mib"] = peak_mib(lambda: fwd_bwd("triton"))
    row["eager_fwd_bwd_peak_mib"] = peak_mib(lambda: fwd_bwd(None))
    flops = 2.0 * n * d * v
    if row["matmul_ms"]:
        row["matmul_tflops"] = flops / row["matmul_ms"] / 1e9
        for key, mult in (("triton_fwd", 1), ("triton_fwd_bwd", 4)):
            if row[f"{key}_ms"]:
                row[f"{key}_tflops"] = mult * flops / row[f"{key}_ms"] / 1e9
                row[f"{key}_pct_of_matmul"] = 100 * row[f"{key}_tflops"] / row["matmul_tflops"]
    RESULTS["timings"].append(row)
    print(f"bench N={n}: " + ", ".join(f"{k}={v:.3g}" for k, v in row.items() if isinstance(v, float)), flush=True)


def environment():
    env = {"torch": torch.__version__, "triton": triton.__version__, "device": str(DEVICE), "dry_run": ARGS.dry_run}
    if DEVICE.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        env["sm_count"] = torch.cuda.get_device_properties(0).multi_processor_count
    try:
        env["git_sha"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        env["git_sha"] = None
    env["autotune"] = ARGS.autotune
    return env


def table():
    fmt = lambda x, spec=".1f": "-" if x is None else format(x, spec)  # noqa: E731
    lines = [
        "N      | triton fwd ms | triton f+b ms | eager fwd ms | eager f+b ms | matmul TF/s | fwd % mm | f+b % mm"
        " | f+b speedup | peak MiB triton/eager",
    ]
    for r in RESULTS["timings"]:
        speed = (
            r["eager_fwd_bwd_ms"] / r["triton_fwd_bwd_ms"] if r["eager_fwd_bwd_ms"] and r["triton_fwd_bwd_ms"] else None
        )
        lines.append(
            f"{r['N']:<6} | {fmt(r['triton_fwd_ms'], '.2f'):>13} | {fmt(r['triton_fwd_bwd_ms'], '.2f'):>13} | "
            f"{fmt(r['eager_fwd_ms'], '.2f'):>12} | {fmt(r['eager_fwd_bwd_ms'], '.2f'):>12} | "
            f"{fmt(r.get('matmul_tflops')):>11} | {fmt(r.get('triton_fwd_pct_of_matmul')):>8} | "
            f"{fmt(r.get('triton_fwd_bwd_pct_of_matmul')):>8} | {fmt(speed, '.2f'):>11} | "
            f"{fmt(r['triton_fwd_bwd_peak_mib'], '.0f')}/{fmt(r['eager_fwd_bwd_peak_mib'], '.0f')}"
        )
    return "\n".join(lines)


def main(dry_run: bool, reps: int = 5) -> dict:
    """Run the checks and timings; returns the results (with "pass" and the "table" text)."""
    global DEVICE
    ARGS.dry_run, ARGS.reps = dry_run, reps
    ARGS.autotune = os.environ.get("FASTRL_AUTOTUNE") == "1"
    DEVICE = torch.device("cpu" if dry_run else "cuda")
    os.environ.setdefault("FASTRL_CHUNK_BYTES", str(2**30))  # the chunked fp32 ground truth: few, big chunks
    RESULTS["correctness"], RESULTS["timings"] = [], []
    RESULTS["environment"] = environment()
    if ARGS.dry_run:
        checks = [(77, 120, 1001, True, 0.7, "fp64"), (300, 64, 700, False, 1.0, "fp32-chunked")]
        sizes, d, v = (64, 128), 64, 512
    else:
        checks = [
            (3001, 4096, 152064, True, 0.7, "fp64"),
            (4096, 4096, 152064, False, 1.0, "fp64"),
            (16384, 256, 152064, False, 1.0, "fp32-chunked"),  # N·V = 2.49e9 > 2^31
        ]
        sizes, d, v = (4096, 16384, 32768), 4096, 152064
    all_ok = all([check(*c) for c in checks])
    if all_ok:
        for n in sizes:
            bench(n, d, v, 1 if ARGS.dry_run else ARGS.reps)
    else:
        print("correctness failed: no timings reported", flush=True)
    RESULTS["pass"] = all_ok
    RESULTS["table"] = table()
    return RESULTS
