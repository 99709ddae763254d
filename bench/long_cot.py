"""One GRPO loss step at long-CoT scale on CPU: 32,768 completion tokens, Qwen's 151,936-token vocabulary.

    PYTHONPATH=. python -m bench.long_cot --D 128 --providers fastrl-torch,fastrl-recompute,trl,liger,eager

Each provider runs in a fresh process: one warm-up fwd+bwd call (token-mean, β = 0.04, fp32; B = 8 sequences
of T = 4096, every peer on the live positions, bench/providers_grpo.py), then `--calls` (≥ 3) timed calls,
each checked against a chunked float32 reference (the package's eager reference over 1024-row chunks, its
gradients by back-propagating the loss's ∂ℓ/∂logp chunk by chunk) built once by the parent. The table
gives the median and the min–max of the timed calls, the peak RSS of the first timed call over the inputs
(bench/harness.py `rss_peak_bytes`) less the returned gradients, and the worst relative L2 error of the
loss, d_hidden and d_weight over the calls. A provider whose float32 logits and their gradient (2·N·V·4
bytes) would not fit in this machine's memory is not started: its requirement is printed instead.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

B, T, V = 8, 4096, 151936
REF_ROWS = 1024
TOL = 1e-4  # fp32, as the bench's correctness gate (bench/harness.py REL_TOL)


def _inputs(d: int):
    import torch

    from bench.bench_grpo_loss import OP

    return OP, OP.make_inputs(dict(B=B, T=T, D=d, V=V), torch.float32, torch.device("cpu"), 0)


def reference(d: int, path: str) -> None:
    """The chunked float32 reference: loss, d_hidden and d_weight, saved to `path`."""
    import torch

    import fastrl
    from fastrl.kernels import LogprobParams, token_logprobs_reference

    _, inputs = _inputs(d)
    h, w = inputs["hidden"].detach(), inputs["weight"].detach()
    targets, mask, adv, old, ref, cfg = inputs["rest"]
    rows = torch.nonzero(mask.reshape(-1)).squeeze(-1)
    h2, t2 = h.reshape(-1, d), targets.reshape(-1)
    logp = torch.zeros(B * T)
    with torch.no_grad():
        for s in range(0, rows.numel(), REF_ROWS):
            r = rows[s : s + REF_ROWS]
            logp[r] = token_logprobs_reference(h2[r], w, t2[r], None, LogprobParams())[0]
    logp = logp.view(B, T).requires_grad_()
    loss = fastrl.policy_loss(logp, adv, mask, old_logprobs=old, ref_logprobs=ref, config=cfg, impl="torch").loss
    (g,) = torch.autograd.grad(loss, logp)
    g = g.reshape(-1)
    dh, w_leaf = torch.zeros_like(h2), w.clone().requires_grad_()
    for s in range(0, rows.numel(), REF_ROWS):
        r = rows[s : s + REF_ROWS]
        h_c = h2[r].clone().requires_grad_()
        lp = token_logprobs_reference(h_c, w_leaf, t2[r], None, LogprobParams())[0]
        lp.backward(g[r])
        dh[r] = h_c.grad
    torch.save({"loss": loss.detach(), "hidden.grad": dh.view(B, T, d), "weight.grad": w_leaf.grad}, path)


def child(provider: str, d: int, calls: int, ref_path: str) -> dict:
    from bench.harness import relative_error, rss_peak_bytes

    op, inputs = _inputs(d)
    fn = op.closure(op.providers[provider], inputs, "fwd+bwd", "time")
    fn()  # warm-up (compilation, thread pools, first-touch of the buffers)
    seconds, outputs, peak = [], [], None
    for i in range(calls):
        box = {}

        def timed(box=box):
            start = time.perf_counter()
            box["out"] = fn()
            box["s"] = time.perf_counter() - start

        if i == 0:
            peak = rss_peak_bytes(timed)
        else:
            timed()
        seconds.append(box["s"])
        outputs.append(box["out"])
    import torch

    want = torch.load(ref_path)
    errors = {k: max(relative_error(o[k], want[k]) for o in outputs) for k in want}
    extra = (peak - op.grad_bytes(inputs, "fwd+bwd")) / 2**20
    return dict(provider=provider, D=d, seconds=seconds, extra_mib=extra, errors=errors,
                loss=float(outputs[0]["loss"]))  # fmt: skip


def mem_total_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def _row_text(r: dict) -> str:
    if "seconds" not in r:
        return f"| {r['provider']} | {r['status']} | — | — | — | — | — | {r.get('load_start', '—')} |"
    s = r["seconds"]
    err = max(r["errors"].values())
    status = r["status"] if err <= TOL else f"FAIL (rel err {err:.1e} > {TOL:g})"
    return (
        f"| {r['provider']} | {status} | {len(s)} | {statistics.median(s):.1f} | {min(s):.1f}–{max(s):.1f} | "
        f"{r['extra_mib']:.0f} | {err:.1e} | {r.get('load_start', '—')} |"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--providers", default="fastrl-torch,fastrl-recompute,trl,liger,eager")
    p.add_argument("--calls", type=int, default=3, help="timed calls per provider, after one warm-up")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--ref", default=None, help=argparse.SUPPRESS)
    p.add_argument("--timeout-s", type=float, default=3600)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.D, args.calls, args.ref)))
        return 0
    if args.calls < 3:
        raise SystemExit(f"--calls must be at least 3 for a spread, got {args.calls}")
    n, total = B * T, mem_total_bytes()
    ref_path = os.path.join(tempfile.mkdtemp(prefix="fastrl-longcot-"), "reference.pt")
    start = time.perf_counter()
    reference(args.D, ref_path)
    print(f"[long_cot] chunked float32 reference in {time.perf_counter() - start:.0f} s", flush=True)
    rows = []
    for name in args.providers.split(","):
        logits_bytes = 2 * n * V * 4  # float32 logits and their gradient, the least a full-logits path holds
        if name in ("eager", "compile") and logits_bytes > total:
            need = f"not run: needs > {logits_bytes / 2**30:.0f} GiB, machine has {total / 2**30:.0f} GiB"
            rows.append(dict(provider=name, status=need))
            print(json.dumps(rows[-1]), flush=True)
            continue
        cmd = [sys.executable, "-m", "bench.long_cot", "--child", name, "--D", str(args.D), "--calls",
               str(args.calls), "--ref", ref_path]  # fmt: skip
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
    print(f"1 warm-up + {args.calls} timed calls per provider, each checked against the chunked float32 reference.\n")
    print("| provider | status | timed calls | median s | min–max s | peak extra MiB | max rel err | load at start |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(_row_text(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
