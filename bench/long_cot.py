"""One GRPO loss step at long-CoT scale on CPU: 32,768 completion tokens, Qwen's 151,936-token vocabulary.

    PYTHONPATH=. python -m bench.long_cot --D 128 --providers fastrl-torch,fastrl-recompute,trl,liger,eager

Each provider runs one fwd+bwd call (token-mean, β = 0.04, fp32; B = 8 sequences of T = 4096) in a fresh
process that reports its wall time and peak RSS over the inputs (bench/harness.py `rss_peak_bytes`). A
provider whose float32 logits and their gradient (2·N·V·4 bytes) would not fit in this machine's
memory is not started: its requirement is printed instead. No correctness check at this size (each
provider is checked against eager at the bench's smaller shapes); the loss values are printed side by
side.
"""

import argparse
import json
import os
import subprocess
import sys
import time

B, T, V = 8, 4096, 151936


def child(provider: str, d: int) -> dict:
    import torch

    from bench.bench_grpo_loss import OP
    from bench.harness import rss_peak_bytes

    inputs = OP.make_inputs(dict(B=B, T=T, D=d, V=V), torch.float32, torch.device("cpu"), 0)
    fn = OP.closure(OP.providers[provider], inputs, "fwd+bwd", "time")
    out = {}

    def timed():
        start = time.perf_counter()
        out["loss"] = float(fn()["loss"])
        out["seconds"] = time.perf_counter() - start

    peak = rss_peak_bytes(timed)
    return dict(provider=provider, D=d, extra_mib=(peak - OP.grad_bytes(inputs, "fwd+bwd")) / 2**20, **out)


def mem_total_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--providers", default="fastrl-torch,fastrl-recompute,trl,liger,eager")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--timeout-s", type=float, default=1800)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.D)))
        return 0
    n, total = B * T, mem_total_bytes()
    rows = []
    for name in args.providers.split(","):
        logits_bytes = 2 * n * V * 4  # float32 logits and their gradient, the least a full-logits path holds
        if name in ("eager", "compile") and logits_bytes > total:
            rows.append(
                dict(
                    provider=name,
                    status=f"not run: needs > {logits_bytes / 2**30:.0f} GiB, machine has {total / 2**30:.0f} GiB",
                )
            )
            print(json.dumps(rows[-1]), flush=True)
            continue
        cmd = [sys.executable, "-m", "bench.long_cot", "--child", name, "--D", str(args.D)]
        load = os.getloadavg()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            rows.append(dict(provider=name, status=f"timeout after {args.timeout_s:.0f} s"))
        else:
            if proc.returncode:
                tail = " | ".join(proc.stderr.strip().splitlines()[-2:])[:300]
                rows.append(dict(provider=name, status=f"exit {proc.returncode}: {tail}"))
            else:
                rows.append(dict(json.loads(proc.stdout.strip().splitlines()[-1]), status="ok"))
        rows[-1]["load_start"] = " ".join(f"{x:.2f}" for x in load)
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n**grpo_loss fwd+bwd, N = {n} (B={B}, T={T}), D = {args.D}, V = {V}, fp32, CPU**\n")
    print("| provider | status | seconds | peak extra MiB | loss | load at start |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        secs = f"{r['seconds']:.0f}" if "seconds" in r else "—"
        mib = f"{r['extra_mib']:.0f}" if "extra_mib" in r else "—"
        loss = f"{r['loss']:.6f}" if "loss" in r else "—"
        print(f"| {r['provider']} | {r['status']} | {secs} | {mib} | {loss} | {r.get('load_start', '—')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
