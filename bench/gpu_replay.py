"""GPU check of the replay kernels (docs/math.md §9): correctness at the long-CoT shape, bit-equality, timings.

At N = 32,768, D = 4,096, V = 151,936 in bf16, kept sets of k = 50 ids per live row (and two rows that kept the
whole vocabulary): impl="triton" against the float32 torch walk on the same (upcast) inputs, every output and
gradient within a bf16 tolerance, and logp / entropy of 256 rows against a float64 materialized reference.
Bit-equality: two identical calls give the same bits (outputs and gradients), and a row's logp / entropy are the
same bits computed alone and inside the batch; so are the plain Triton path's with `batch_invariant=True`
(docs/math.md §1.2). Timings: replay fwd+bwd beside the plain Triton call's. A time
is reported only when the checks passed. `--dry-run`: tiny shapes on CPU through the Triton interpreter.
"""

import time

import torch

import fastrl
from bench.bench_replay import kept_sets
from bench.gpu_kernels import rel_err, timed
from fastrl.kernels.logprobs.replay_naive import replay_logprobs_reference

BF16_TOL = 4e-3  # one bf16 ulp, relative to the scale of the value compared
F32_TOL = 1e-5
FULL_ROWS = 2  # rows 0 and 1 kept every id of the vocabulary
CHECK_ROWS = 256


def problem(n, d, v, k, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=gen).to(torch.bfloat16)
    weight = (torch.randn(v, d, generator=gen) * (2.0 / d**0.5)).to(torch.bfloat16)
    targets = torch.randint(0, v, (n,), generator=gen)
    targets[torch.rand(n, generator=gen) < 0.1] = -100
    targets[:FULL_ROWS] = torch.randint(0, v, (FULL_ROWS,), generator=gen)
    ids, offsets = kept_sets(targets[FULL_ROWS:], v, k, seed)
    full = torch.arange(v, dtype=torch.int32).repeat(FULL_ROWS)
    ids = torch.cat([full, ids])
    offsets = torch.cat([torch.arange(FULL_ROWS) * v, offsets + FULL_ROWS * v])
    return [t.to(device) for t in (hidden, weight, targets, ids, offsets)]


def call(hidden, weight, targets, ids, offsets, impl, g=None, e=None, grad=True):
    h, w = hidden.detach().requires_grad_(grad), weight.detach().requires_grad_(grad)
    logp, entropy = fastrl.token_logprobs(
        h, w, targets, kept_ids=ids, kept_offsets=offsets, impl=impl, return_entropy=True
    )
    res = {"logp": logp.detach(), "entropy": entropy.detach()}
    if grad:
        res["d_hidden"], res["d_weight"] = torch.autograd.grad((logp * g + entropy * e).sum(), (h, w))
    return res


def check(n, d, v, k, device):
    """(pass, rows of the table) of the correctness and bit-equality checks."""
    hidden, weight, targets, ids, offsets = problem(n, d, v, k, device)
    gen = torch.Generator().manual_seed(1)
    g, e = (torch.randn(n, generator=gen).to(device) for _ in range(2))
    got = call(hidden, weight, targets, ids, offsets, "triton", g, e)
    ref = call(hidden.float(), weight.float(), targets, ids, offsets, "torch", g, e)
    rows, ok = [], True
    for name, want in ref.items():
        tol = BF16_TOL if got[name].dtype == torch.bfloat16 else F32_TOL
        err = rel_err(got[name], want)
        passed = bool(torch.isfinite(got[name]).all()) and err <= tol
        ok &= passed
        rows.append(f"| {name} vs torch fp32 | {err:.2e} | {tol:.0e} | {'ok' if passed else 'FAIL'} |")
    sub = slice(0, min(n, CHECK_ROWS))
    ref64 = replay_logprobs_reference(
        hidden[sub].double(), weight.double(), targets[sub], ids[: offsets[sub.stop]], offsets[: sub.stop + 1]
    )
    for name in ("logp", "entropy"):
        err = rel_err(got[name][sub], ref64[name])
        passed = err <= F32_TOL
        ok &= passed
        rows.append(
            f"| {name} vs float64 ({sub.stop} rows) | {err:.2e} | {F32_TOL:.0e} | {'ok' if passed else 'FAIL'} |"
        )
    again = call(hidden, weight, targets, ids, offsets, "triton", g, e)
    same = all(torch.equal(got[x], again[x]) for x in got)
    probe = n // 2 + int(torch.nonzero(targets[n // 2 :] != -100)[0])  # a live row in the middle
    alone = call(hidden[probe : probe + 1], weight, targets[probe : probe + 1],
                 ids[offsets[probe] : offsets[probe + 1]], offsets[probe : probe + 2] - offsets[probe], "triton",
                 grad=False)  # fmt: skip
    invariant = all(torch.equal(alone[x][0], got[x][probe]) for x in ("logp", "entropy"))
    ok &= same and invariant
    rows.append(
        f"| two identical calls: every output and gradient | bit-equal: {same} | - | {'ok' if same else 'FAIL'} |"
    )
    rows.append(f"| row {probe} alone vs in the batch (logp, entropy) | bit-equal: {invariant} | - | "
                f"{'ok' if invariant else 'FAIL'} |")  # fmt: skip
    plain = plain_row_invariant(hidden, weight, targets, probe)
    ok &= plain
    rows.append(f"| plain, batch_invariant: row {probe} alone vs in the batch (logp, entropy) | bit-equal: {plain} "
                f"| - | {'ok' if plain else 'FAIL'} |")  # fmt: skip
    return ok, rows


def plain_row_invariant(hidden, weight, targets, probe) -> bool:
    """Whether the plain Triton path with batch_invariant=True gives row `probe` the same logp / entropy bits
    alone and in the batch (two calls)."""
    with torch.no_grad():
        kw = dict(return_entropy=True, impl="triton", batch_invariant=True)
        batch = fastrl.token_logprobs(hidden, weight, targets, **kw)
        alone = fastrl.token_logprobs(hidden[probe : probe + 1], weight, targets[probe : probe + 1], **kw)
    return all(torch.equal(a[0], b[probe]) for a, b in zip(alone, batch))


def bench(n, d, v, k, device, reps):
    hidden, weight, targets, ids, offsets = problem(n, d, v, k, device, seed=2)
    g = torch.randn(n, device=device)
    h, w = hidden.requires_grad_(), weight.requires_grad_()

    def replay():
        logp = fastrl.token_logprobs(h, w, targets, kept_ids=ids, kept_offsets=offsets, impl="triton")
        torch.autograd.grad((logp * g).sum(), (h, w))

    def plain():
        logp = fastrl.token_logprobs(h, w, targets, impl="triton")
        torch.autograd.grad((logp * g).sum(), (h, w))

    return timed(replay, reps), timed(plain, reps)


def main(dry_run: bool, reps: int = 5) -> dict:
    device = torch.device("cpu" if dry_run else "cuda")
    n, d, v, k = (24, 32, 160, 6) if dry_run else (32768, 4096, 151936, 50)
    start = time.time()
    ok, rows = check(n, d, v, k, device)
    res = {"pass": ok, "shape": dict(N=n, D=d, V=v, k=k), "check_seconds": round(time.time() - start, 1)}
    table = [f"N={n} D={d} V={v} k={k} (bf16; {FULL_ROWS} rows keep all V ids)", "",
             "| check | error | bound | verdict |", "|---|---|---|---|", *rows]  # fmt: skip
    if ok:
        replay_ms, plain_ms = bench(n, d, v, k, device, reps)
        res.update(replay_fwd_bwd_ms=replay_ms, plain_fwd_bwd_ms=plain_ms)
        ratio = replay_ms / plain_ms if replay_ms and plain_ms else None
        fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
        table += ["", "| fwd+bwd | replay k=%d ms | plain ms | replay / plain |" % k, "|---|---|---|---|",
                  f"| triton | {fmt(replay_ms)} | {fmt(plain_ms)} | {fmt(ratio)} |"]  # fmt: skip
    else:
        table.append("\ncorrectness failed: no timings reported")
    res["table"] = "\n".join(table)
    return res
