"""Benchmark of the replay path (`token_logprobs(..., kept_ids=, kept_offsets=)`, docs/math.md §9) on the CPU.

fwd+bwd (forward, then `autograd.grad` for hidden and weight), fp32, impl="torch", at N=8192, D=512, V=32768
for kept sets of k ∈ {20, 50, 512} ids per live row (the target and k − 1 others), next to fastrl's plain call
and its θ-recompute call with the same top_k. Each provider is first checked against the float64 reference
(`replay_logprobs_reference` / the sampled reference) on CHECK_ROWS rows; only a passing one is timed. Peak
memory is the shared harness's (a fresh interpreter, `bench/_memchild.py`), minus the gradients returned.

    python -m bench.bench_replay [--N 8192 --D 512 --V 32768] [--ks 20,50,512] [--reps 1]
    python -m bench.bench_replay --N 32768 --D 4096 --V 151936 --ks 50 --providers replay --no-memory

The second line is the long-CoT shape (about 2.5 GB of float32 head): replay alone, one timed call.
"""

import argparse
import json
import statistics

import torch

from bench.bench_token_logprobs import IGNORE_INDEX, TokenLogprobsOp
from bench.harness import cpu_peak_in_subprocess, extra_memory_fields, relative_error, time_closure
from bench.providers import Provider, always
from bench.runenv import git_sha, load_average
from fastrl import token_logprobs
from fastrl.kernels.logprobs.naive import sampled_logprobs_reference
from fastrl.kernels.logprobs.replay_naive import replay_logprobs_reference

CHECK_ROWS = 256
REL_TOL = 1e-4
_SETS: dict = {}  # (N, V, k) → (kept_ids, kept_offsets) of the inputs made last at that shape


def kept_sets(targets: torch.Tensor, vocab: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """k distinct ids per live row, its target first (random gaps of < V/k after it, wrapped), none on ignored
    rows: the CSR (int32 ids, int64 offsets). Which ids does not change the cost; how many does."""
    gen = torch.Generator().manual_seed(seed)
    live = targets != IGNORE_INDEX
    y = targets[live]
    gaps = torch.randint(1, max(2, vocab // k), (y.shape[0], k - 1), generator=gen)
    ids = torch.cat([y.unsqueeze(1), (y.unsqueeze(1) + gaps.cumsum(1)) % vocab], 1)
    sizes = torch.where(live, k, 0)
    offsets = torch.zeros(targets.shape[0] + 1, dtype=torch.int64)
    torch.cumsum(sizes, 0, out=offsets[1:])
    return ids.reshape(-1).to(torch.int32), offsets


def _replay(k):
    def fn(h, w, t):
        ids, offsets = _SETS[(t.shape[0], w.shape[0], k)]
        return token_logprobs(h, w, t, kept_ids=ids, kept_offsets=offsets, impl="torch", ignore_index=IGNORE_INDEX)

    return fn


def _theta(k):
    return lambda h, w, t: token_logprobs(h, w, t, impl="torch", top_k=k)


KS = (20, 50, 512)
PROVIDERS = {"plain": Provider("plain", lambda h, w, t: token_logprobs(h, w, t, impl="torch"), always)}
for _k in KS:
    PROVIDERS[f"theta-top_k{_k}"] = Provider(f"theta-top_k{_k}", _theta(_k), always)
    PROVIDERS[f"replay-k{_k}"] = Provider(f"replay-k{_k}", _replay(_k), always)


class ReplayOp(TokenLogprobsOp):
    name = "replay"
    providers = PROVIDERS
    tiny_shape = dict(N=64, D=64, V=1024)

    def make_inputs(self, shape, dtype, device, seed):
        inputs = super().make_inputs(shape, dtype, device, seed)
        for k in KS:
            if k < shape["V"]:
                _SETS[(shape["N"], shape["V"], k)] = kept_sets(inputs["targets"], shape["V"], k, seed)
        return inputs


OP = ReplayOp()


def check(name: str, inputs: dict) -> dict:
    """Relative errors of the provider on CHECK_ROWS rows against the float64 reference of the same problem."""
    h, w, t = inputs["hidden"].detach(), inputs["weight"].detach(), inputs["targets"]
    rows = slice(0, CHECK_ROWS)
    h_rows, w_ref = h[rows].clone().requires_grad_(), w.clone().requires_grad_()
    g = torch.randn(CHECK_ROWS)
    h64, w64 = h[rows].double().requires_grad_(), w.double().requires_grad_()
    if name.startswith("replay"):
        k = int(name.removeprefix("replay-k"))
        ids, offsets = _SETS[(t.shape[0], w.shape[0], k)]
        ids, offsets = ids[: offsets[CHECK_ROWS]], offsets[: CHECK_ROWS + 1]
        logp = token_logprobs(h_rows, w_ref, t[rows], kept_ids=ids, kept_offsets=offsets, impl="torch")
        ref = replay_logprobs_reference(h64, w64, t[rows], ids, offsets)["logp"]
    else:
        logp = PROVIDERS[name].fn(h_rows, w_ref, t[rows])
        top_k = {"top_k": torch.full((CHECK_ROWS,), int(name.removeprefix("theta-top_k")))} if "theta" in name else {}
        ref = sampled_logprobs_reference(h64, w64, t[rows], **top_k)["logp"]
    got = (logp.detach(), *torch.autograd.grad(logp, (h_rows, w_ref), g))
    want = (ref.detach(), *torch.autograd.grad(ref, (h64, w64), g.double()))
    return {k: relative_error(a, b) for k, a, b in zip(("logp", "hidden.grad", "weight.grad"), got, want)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--N", type=int, default=8192)
    ap.add_argument("--D", type=int, default=512)
    ap.add_argument("--V", type=int, default=32768)
    ap.add_argument("--ks", default=",".join(map(str, KS)))
    ap.add_argument("--providers", default="plain,theta,replay", help="any of plain, theta, replay")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--no-memory", action="store_true", help="skip the memory child (the long-CoT shape)")
    ap.add_argument("--no-check", action="store_true", help="skip the float64 check (it holds [V, D] in float64)")
    args = ap.parse_args()
    shape = dict(N=args.N, D=args.D, V=args.V)
    ks = [int(k) for k in args.ks.split(",")]
    kinds = args.providers.split(",")
    if bad := [k for k in ks if k not in KS]:  # the providers (and the memory child's) exist for KS only
        ap.error(f"--ks {bad} not among the registered set sizes {list(KS)}")
    if bad := [kind for kind in kinds if kind not in ("plain", "theta", "replay")]:
        ap.error(f"--providers {bad}: each must be plain, theta or replay")
    names = (["plain"] if "plain" in kinds else []) + [
        f"{kind}-{'top_k' if kind == 'theta' else 'k'}{k}" for k in ks for kind in ("theta", "replay") if kind in kinds
    ]
    device = torch.device("cpu")
    inputs = OP.make_inputs(shape, torch.float32, device, seed=0)
    results = {"shape": shape, "git_sha": git_sha(), "threads": torch.get_num_threads(), "rows": []}
    for name in names:
        row = {"provider": name, "load_before": load_average()}
        if not args.no_check:
            row["errors"] = check(name, inputs)
            if max(row["errors"].values()) > REL_TOL:
                row["status"] = "FAIL"
                results["rows"].append(row)
                print(json.dumps(row), flush=True)
                continue
        fn = OP.closure(PROVIDERS[name], inputs, "fwd+bwd", upstream="time")
        ms = time_closure(fn, device, warmup=1 if args.reps > 1 else 0, reps=args.reps, budget_s=600)
        row.update(status="ok", median_ms=statistics.median(ms), samples_ms=ms, load_after=load_average())
        if not args.no_memory:
            mem = cpu_peak_in_subprocess(dict(op="replay", provider=name, shape=shape, dtype="fp32", mode="fwd+bwd",
                                              seed=0))  # fmt: skip
            row.update(extra_memory_fields(mem))
        results["rows"].append(row)
        print(json.dumps(row), flush=True)
    by = {r["provider"]: r for r in results["rows"] if r.get("status") == "ok"}
    if "plain" in by:
        for r in by.values():
            r["time_vs_plain"] = r["median_ms"] / by["plain"]["median_ms"]
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
