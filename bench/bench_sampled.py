"""Benchmark of `fastrl.token_logprobs` with vLLM's truncation (docs/math.md §8) against the plain call.

fwd+bwd (forward, then `autograd.grad` for hidden and weight) on the CPU, fp32, impl="torch", at the acceptance
shape N=8192, D=512, V=32768, for top-p 0.9, top-k 50 and min-p 0.1, next to the plain call and eager. Each
truncated provider is first checked against the float64 materialized reference on a subset of rows (logp and
the gradients of those rows); only a passing one is timed. Peak memory is measured by the shared harness in a
fresh interpreter (`bench/_memchild.py`), minus the gradients the op returns.

    python -m bench.bench_sampled [--N 8192 --D 512 --V 32768] [--reps 3]
"""

import argparse
import json
import statistics

import torch

from bench.bench_token_logprobs import TokenLogprobsOp
from bench.harness import cpu_peak_in_subprocess, extra_memory_fields, relative_error, time_closure
from bench.providers import Provider, always
from bench.runenv import git_sha, load_average
from fastrl import token_logprobs
from fastrl.kernels import LogprobParams, sampled_logprobs_reference, token_logprobs_reference

OPTIONS = {"plain": {}, "top_p0.9": dict(top_p=0.9), "top_k50": dict(top_k=50), "min_p0.1": dict(min_p=0.1)}
CHECK_ROWS = 256
REL_TOL = 1e-4


def _fastrl(opts):
    return lambda h, w, t: token_logprobs(h, w, t, impl="torch", **opts)


def _eager(h, w, t):
    return token_logprobs_reference(h, w, t, None, LogprobParams())[0]


PROVIDERS = {name: Provider(name, _fastrl(opts), always) for name, opts in OPTIONS.items()}
PROVIDERS["eager"] = Provider("eager", _eager, always)


class SampledOp(TokenLogprobsOp):
    name = "sampled"
    providers = PROVIDERS


OP = SampledOp()


def check(name: str, inputs: dict) -> dict:
    """Relative errors of the provider on CHECK_ROWS rows against the float64 reference with the same options."""
    h, w, t = inputs["hidden"].detach(), inputs["weight"].detach(), inputs["targets"]
    rows = slice(0, CHECK_ROWS)
    h_rows, w_ref = h[rows].clone().requires_grad_(), w.clone().requires_grad_()
    g = torch.randn(CHECK_ROWS)
    logp = PROVIDERS[name].fn(h_rows, w_ref, t[rows])
    got = (logp.detach(), *torch.autograd.grad(logp, (h_rows, w_ref), g))
    opts = {k: torch.full((CHECK_ROWS,), v) for k, v in OPTIONS.get(name, {}).items()}
    h64, w64 = h[rows].double().requires_grad_(), w.double().requires_grad_()
    ref = sampled_logprobs_reference(h64, w64, t[rows], **opts)["logp"]
    want = (ref.detach(), *torch.autograd.grad(ref, (h64, w64), g.double()))
    return {k: relative_error(a, b) for k, a, b in zip(("logp", "hidden.grad", "weight.grad"), got, want)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--N", type=int, default=8192)
    ap.add_argument("--D", type=int, default=512)
    ap.add_argument("--V", type=int, default=32768)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--providers", default=",".join(PROVIDERS))
    args = ap.parse_args()
    shape = dict(N=args.N, D=args.D, V=args.V)
    device = torch.device("cpu")
    inputs = OP.make_inputs(shape, torch.float32, device, seed=0)
    results = {"shape": shape, "git_sha": git_sha(), "threads": torch.get_num_threads(), "rows": []}
    for name in args.providers.split(","):
        row = {"provider": name, "load_before": load_average()}
        if name != "eager":
            row["errors"] = check(name, inputs)
            if max(row["errors"].values()) > REL_TOL:
                row["status"] = "FAIL"
                results["rows"].append(row)
                print(json.dumps(row), flush=True)
                continue
        fn = OP.closure(PROVIDERS[name], inputs, "fwd+bwd", upstream="time")
        ms = time_closure(fn, device, warmup=1, reps=args.reps, budget_s=120)
        mem = cpu_peak_in_subprocess(dict(op="sampled", provider=name, shape=shape, dtype="fp32", mode="fwd+bwd",
                                          seed=0))  # fmt: skip
        row.update(status="ok", median_ms=statistics.median(ms), samples_ms=ms, load_after=load_average())
        row.update(extra_memory_fields(mem))
        results["rows"].append(row)
        print(json.dumps(row), flush=True)
    by = {r["provider"]: r for r in results["rows"] if r.get("status") == "ok"}
    if "plain" in by:
        for r in by.values():
            r["time_vs_plain"] = r["median_ms"] / by["plain"]["median_ms"]
            if "eager" in by and "extra_mib" in r and "extra_mib" in by["eager"]:
                r["extra_vs_eager"] = r["extra_mib"] / by["eager"]["extra_mib"]
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
