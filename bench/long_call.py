"""One long call on the chunked path: N = 131,072 rows through `token_logprobs` and `grpo_loss`, fwd+bwd.

    PYTHONPATH=. python -m bench.long_call                  # N=131072 D=64 V=32768, fp32, impl="torch"

Each op runs once (the inputs' float32 logits would be N·V·4 = 16 GiB; the op keeps one tile). Checked against
the package's eager reference on 512 random rows: token_logprobs' logp there, and its d_hidden / d_weight for an
upstream gradient that is zero outside those rows (so those rows alone give the exact full-call gradient);
grpo_loss's loss against `policy_loss` on the reference log-probs of every row, and its d_hidden / d_weight
against that loss's gradient carried through the reference head (both in 4,096-row chunks, untimed).
Prints wall time, the peak RSS during the call over the RSS just before it (bench/harness.py `rss_peak_bytes`,
so the returned gradients count too) and the worst relative error of each op; an op over 1e-5 is FAIL with no
figures, and the exit status 1.
"""

import argparse
import sys
import time

import torch

import fastrl
from bench.harness import rss_peak_bytes
from fastrl import LossConfig
from fastrl.kernels import token_logprobs_reference

CHECK_ROWS, REF_CHUNK = 512, 4096
TOL = 1e-5  # worst relative error of an op's value and gradients against the eager reference


def _timed(fn):
    """(result, wall seconds, peak RSS over the RSS before the call in MiB) of one call of fn."""
    box = {}

    def call():
        t0 = time.perf_counter()
        box["out"] = fn()
        box["wall"] = time.perf_counter() - t0
        return box["out"]

    peak = rss_peak_bytes(call)
    return box["out"], box["wall"], peak / 2**20


def _rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _ref_logp(h, w, y):
    out = torch.empty(h.shape[0])
    with torch.no_grad():
        for s in range(0, h.shape[0], REF_CHUNK):
            out[s : s + REF_CHUNK] = token_logprobs_reference(h[s : s + REF_CHUNK], w, y[s : s + REF_CHUNK])[0]
    return out


def token_logprobs_call(n, d, v, gen):
    h = torch.randn(n, d, generator=gen).requires_grad_()
    w = (torch.randn(v, d, generator=gen) * (2.0 / d**0.5)).requires_grad_()
    y = torch.randint(0, v, (n,), generator=gen)
    rows = torch.randperm(n, generator=gen)[:CHECK_ROWS].sort().values
    g = torch.zeros(n)
    g[rows] = torch.randn(CHECK_ROWS, generator=gen)

    def call():
        logp = fastrl.token_logprobs(h, w, y, impl="torch")
        return (logp, *torch.autograd.grad(logp, (h, w), g))

    (logp, dh, dw), wall, rise = _timed(call)
    h_r, w_r = h.detach()[rows].requires_grad_(), w.detach().requires_grad_()
    ref = token_logprobs_reference(h_r, w_r, y[rows])[0]
    rdh, rdw = torch.autograd.grad(ref, (h_r, w_r), g[rows])
    err = max(_rel(logp.detach()[rows], ref), _rel(dh[rows], rdh), _rel(dw, rdw))
    return wall, rise, err


def _ref_grads(h, w, y, gl):
    """d(Σ logp·gl)/dh, /dw of the eager reference, REF_CHUNK rows at a time (gl: the loss's gradient in logp)."""
    dh, dw = torch.empty_like(h), torch.zeros_like(w)
    w_r = w.detach().requires_grad_()
    for s in range(0, h.shape[0], REF_CHUNK):
        h_c = h[s : s + REF_CHUNK].detach().requires_grad_()
        logp = token_logprobs_reference(h_c, w_r, y[s : s + REF_CHUNK])[0]
        g_h, g_w = torch.autograd.grad(logp, (h_c, w_r), gl[s : s + REF_CHUNK])
        dh[s : s + REF_CHUNK] = g_h
        dw += g_w
    return dh, dw


def grpo_loss_call(n, d, v, gen):
    b, t = n // 4096, 4096
    h = torch.randn(b, t, d, generator=gen).requires_grad_()
    w = (torch.randn(v, d, generator=gen) * (2.0 / d**0.5)).requires_grad_()
    y = torch.randint(0, v, (b, t), generator=gen)
    mask = torch.ones(b, t, dtype=torch.bool)
    adv = torch.randn(b, generator=gen)
    ref_logp = _ref_logp(h.detach().reshape(n, d), w.detach(), y.reshape(n)).view(b, t)
    old = ref_logp + 0.1 * torch.randn(b, t, generator=gen)
    cfg = LossConfig(loss_agg="token-mean", beta=0.04)

    def call():
        out = fastrl.grpo_loss(h, w, y, mask, adv, old_logprobs=old, ref_logprobs=old, config=cfg, impl="torch")
        return (out.loss, *torch.autograd.grad(out.loss, (h, w)))

    (loss, dh, dw), wall, rise = _timed(call)
    # the reference: policy_loss on the reference log-probs, its gradient in them carried through the eager head
    logp = ref_logp.clone().requires_grad_()
    want = fastrl.policy_loss(logp, adv, mask, old_logprobs=old, ref_logprobs=old, config=cfg, impl="torch").loss
    (gl,) = torch.autograd.grad(want, logp)
    rdh, rdw = _ref_grads(h.detach().reshape(n, d), w.detach(), y.reshape(n), gl.reshape(n))
    return wall, rise, max(_rel(loss.detach(), want), _rel(dh.reshape(n, d), rdh), _rel(dw, rdw))


def main(argv=None) -> int:
    """Prints one row per op; an op whose worst relative error passes TOL is FAIL with no figures (exit 1)."""
    p = argparse.ArgumentParser(prog="python -m bench.long_call", description=__doc__.splitlines()[0])
    p.add_argument("--N", type=int, default=131072)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--V", type=int, default=32768)
    a = p.parse_args(argv)
    if a.N % 4096:
        raise ValueError(f"--N must be a multiple of 4096 (grpo_loss rows of 4,096 tokens), got {a.N}")
    gen = torch.Generator().manual_seed(0)
    print(f"N={a.N} D={a.D} V={a.V} fp32 impl=torch, torch threads {torch.get_num_threads()}")
    print("| op | wall s | peak RSS rise MiB | worst rel err |\n|---|---|---|---|")
    failed = []
    for name, fn in (("token_logprobs", token_logprobs_call), ("grpo_loss", grpo_loss_call)):
        wall, rise, err = fn(a.N, a.D, a.V, gen)
        if err <= TOL:
            print(f"| {name} | {wall:.1f} | {rise:.0f} | {err:.1e} |", flush=True)
        else:  # NaN too
            failed.append(name)
            print(f"| {name} | FAIL | — | {err:.1e} > {TOL:g} |", flush=True)
    if failed:
        print(f"FAILED: {', '.join(failed)}: wrong values or gradients, no figures", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
