"""The speed cost of `batch_invariant=True` on the CPU torch path (docs/math.md §1.2): fwd+bwd of `token_logprobs`
(plain, and top-k 50 + top-p 0.9) and of `grpo_loss` (the gradient-in-forward pass), with and without the flag, at
D = 512, V = 32,768 and a few token counts. Each configuration first checks that the two calls agree to float32
rounding (a figure is reported only then), then prints the median of `--reps` timed runs.

    PYTHONPATH=$PWD python -m bench.invariance [--tokens 100,1000,4096] [--reps 3]
"""

import argparse
import statistics
import time

import torch

from fastrl import grpo_loss, token_logprobs

D, V = 512, 32768


def _inputs(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden, weight = torch.randn(n, D, generator=gen), torch.randn(V, D, generator=gen) * 0.05
    return hidden, weight, torch.randint(0, V, (n,), generator=gen)


def _logprob_step(kind, n, invariant):
    h, w, y = _inputs(n)
    sampler = dict(top_k=50, top_p=0.9) if kind == "theta" else {}

    def step():
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        logp, ent = token_logprobs(hh, ww, y, return_entropy=True, impl="torch", batch_invariant=invariant, **sampler)
        (logp.sum() + ent.sum()).backward()
        return logp.detach(), hh.grad

    return step


def _loss_step(n, invariant):
    h, w, y = _inputs(n)
    t = 64 if n % 64 == 0 else n
    shape = (n // t, t)
    mask, adv = torch.ones(shape), torch.linspace(-1, 1, shape[0])

    def step():
        hh, ww = h.reshape(*shape, D).clone().requires_grad_(), w.clone().requires_grad_()
        out = grpo_loss(hh, ww, y.reshape(shape), mask, adv, impl="torch", batch_invariant=invariant)
        out.loss.backward()
        return out.loss.detach(), hh.grad

    return step


def _median_s(step, reps):
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="100,1000,4096")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, D={D}, V={V}, fwd+bwd, median of {args.reps}")
    print(f"{'op':<22}{'N':>6}{'default s':>11}{'invariant s':>13}{'ratio':>8}")
    for n in (int(x) for x in args.tokens.split(",")):
        for name, make in (
            ("token_logprobs", lambda inv: _logprob_step("plain", n, inv)),
            ("token_logprobs top-p", lambda inv: _logprob_step("theta", n, inv)),
            ("grpo_loss (fused)", lambda inv: _loss_step(n, inv)),
        ):
            base, inv = make(False), make(True)
            for a, b in zip(base(), inv()):  # the check run doubles as the warm-up
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
            t0, t1 = _median_s(base, args.reps), _median_s(inv, args.reps)
            print(f"{name:<22}{n:>6}{t0:>11.3f}{t1:>13.3f}{t1 / t0:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
