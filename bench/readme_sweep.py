"""The README figure's measurements: `token_logprobs` and `grpo_loss` fwd+bwd against tokens at an LM head's shape.

Each provider at each point runs in a fresh process (`bench._memchild` with an outputs path): its first call
gives the peak extra memory and the first time, and its outputs, which are checked here against the reference;
further calls are timed (`reps` in all below ONE_REP_FROM tokens, one from there). A point costs a provider one
call where the harness's `run_group` spends three (checked, timed, measured). What this module adds for a large
vocabulary on a small CPU:

- a reference that always fits: eager PyTorch where its predicted need fits the process limit, else the same
  eager reference computed in row blocks (float32, the same inputs, the exact gradients by the chain rule);
- a memory limit: the whole sweep, and with it every memory child, runs under `RLIMIT_AS`, and a provider that
  keeps the `[N, V]` logits is not started where N x V x 4 bytes x its factor would pass that limit;
- a time limit: a provider is not started at a point where one call would take longer than `max_call_s`,
  predicted from its own call at the largest smaller point of the same run, nor past its `max_tokens` entry.

A point not run is a `skipped` row with its reason (and predicted need); it is never drawn as measured.
"""

import os
import resource
import tempfile
import time

import torch

from bench.bench_grpo_loss import OP as GRPO_OP
from bench.bench_token_logprobs import OP as TOKEN_OP
from bench.harness import REL_TOL, Result, cpu_peak_in_subprocess, quantiles, relative_error
from fastrl import policy_loss
from fastrl.kernels import LogprobParams, token_logprobs_reference

OPS = {"token_logprobs": TOKEN_OP, "grpo_loss": GRPO_OP}
SEQ_LEN = 1024  # grpo_loss points are B sequences of this many positions (B = tokens / SEQ_LEN)
BLOCK_ROWS = 512  # rows per block of the blocked eager reference
GIB = 2**30
# Bytes held per (token, vocabulary entry) / 4 in fp32 fwd+bwd by the providers that keep the [N, V] logits on
# CPU, from the extra memory the earlier README run measured (eager 2.9-3.0x, CCE's torch_compile path 0.94x)
LOGIT_FACTOR = {"eager": 3.0, "cce": 1.0}
SEED = 0
CHILD_TIMEOUT_S = 3600  # one provider at one point, all its calls
OOM_WORDS = ("MemoryError", "out of memory", "can't allocate", "DefaultCPUAllocator")
ONE_REP_FROM = 4096  # from this many tokens a point is one call (memory and a single time)


def shape_at(op_name: str, tokens: int, d: int, v: int) -> dict:
    if op_name == "token_logprobs":
        return dict(N=tokens, D=d, V=v)
    if tokens % SEQ_LEN:
        raise ValueError(f"grpo_loss points need a multiple of {SEQ_LEN} tokens, got {tokens}")
    return dict(B=tokens // SEQ_LEN, T=SEQ_LEN, D=d, V=v)


def predicted_bytes(provider: str, tokens: int, d: int, v: int) -> int | None:
    """The process's predicted peak for a provider that keeps the logits: the logits' share, the inputs and
    their gradients, and the reference's gradients held beside them; None for one that does not keep them."""
    factor = LOGIT_FACTOR.get(provider)
    if factor is None:
        return None
    return int(tokens * v * 4 * factor) + 3 * 4 * (v * d + tokens * d)


def blocked_grpo_loss(inputs: dict) -> dict:
    """The eager grpo_loss (eager log-probs of the live rows, then `fastrl.policy_loss`) in blocks: the log-probs
    without a graph, the loss and its gradient in the log-probs, then each block's log-probs again with a graph
    and that gradient pulled back through them."""
    h, w = inputs["hidden"].detach(), inputs["weight"].detach()
    targets, mask, advantages, old, ref, config = inputs["rest"]
    if config.temperature != 1.0 or config.entropy_coef != 0:
        raise ValueError(f"the blocked reference covers temperature 1 without entropy, got {config}")
    b, t, d = h.shape
    flat_h, flat_t = h.reshape(-1, d), targets.reshape(-1)
    rows = torch.nonzero(mask.reshape(-1)).squeeze(-1)
    logp = torch.zeros(b * t)
    with torch.no_grad():
        for start in range(0, rows.numel(), BLOCK_ROWS):
            r = rows[start : start + BLOCK_ROWS]
            logp[r] = token_logprobs_reference(flat_h[r], w, flat_t[r], None, LogprobParams())[0]
    logp_leaf = logp.view(b, t).requires_grad_()
    loss = policy_loss(logp_leaf, advantages, mask, old_logprobs=old, ref_logprobs=ref, config=config, impl="torch")
    (g,) = torch.autograd.grad(loss.loss, logp_leaf)
    g = g.reshape(-1)
    w_leaf = inputs["weight"].detach().requires_grad_()
    dh, dw = torch.zeros_like(flat_h), torch.zeros_like(w)
    for start in range(0, rows.numel(), BLOCK_ROWS):
        r = rows[start : start + BLOCK_ROWS]
        h_b = flat_h[r].requires_grad_()
        logp_b = token_logprobs_reference(h_b, w_leaf, flat_t[r], None, LogprobParams())[0]
        dh_b, dw_b = torch.autograd.grad(logp_b, (h_b, w_leaf), g[r])
        dh[r], dw = dh_b, dw + dw_b
    return {"loss": loss.loss.detach(), "hidden.grad": dh.view(b, t, d), "weight.grad": dw}


def limit_address_space(limit_bytes: int) -> None:
    """RLIMIT_AS for this process and every child it starts (the harness's memory children inherit it)."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY and hard < limit_bytes:
        raise ValueError(f"the hard RLIMIT_AS ({hard} bytes) is below the requested limit ({limit_bytes} bytes)")
    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, hard))


def _skipped(op_name: str, provider: str, shape: dict, note: str) -> Result:
    return Result(op_name, provider, "fwd+bwd", dict(shape), "fp32", status="skipped", note=note)


def sweep_point(op_name, providers, tokens, d, v, limits, seconds_per_token, reps) -> tuple[list[Result], str]:
    """One token count of one op: each provider that fits the limits through `one_call`, the others as skipped
    rows. Returns the rows and the reference used ("eager" or "eager in row blocks")."""
    limit_bytes, max_call_s, max_tokens = limits
    shape = shape_at(op_name, tokens, d, v)
    reps = reps if tokens < ONE_REP_FROM else 1
    rows, run = [], []
    for name in providers:
        need = predicted_bytes(name, tokens, d, v)
        per_token = seconds_per_token.get((op_name, name))
        if need is not None and need > limit_bytes:
            note = f"needs > {limit_bytes / GIB:.0f} GiB (predicted {need / GIB:.1f} GiB): not run"
            rows.append(_skipped(op_name, name, shape, note))
        elif tokens > max_tokens.get(name, tokens):
            note = f"not run past {max_tokens[name]:,} tokens (--max-tokens), to fit the run's time"
            rows.append(_skipped(op_name, name, shape, note))
        elif per_token is not None and per_token * tokens > max_call_s:
            note = f"not measured: a call predicted at {per_token * tokens:.0f} s > {max_call_s:.0f} s"
            rows.append(_skipped(op_name, name, shape, note))
        else:
            run.append(name)
    eager_need = predicted_bytes("eager", tokens, d, v)
    fits = eager_need <= limit_bytes
    op = OPS[op_name]
    inputs = op.make_inputs(shape, torch.float32, torch.device("cpu"), SEED)
    live = op.live_rows(inputs)
    reference = None
    if op_name == "token_logprobs":  # its reference is row-limited and always fits
        reference = op.reference(inputs)
    elif not fits:
        reference = blocked_grpo_loss(inputs)
    elif op.baseline not in run:
        reference = op.reference(inputs)
    del inputs
    if reference is None:  # eager itself runs here: its call is the reference
        run.remove(op.baseline)
        res, reference = one_call(op, op.baseline, shape, reps, None)
        rows.append(res)
    for name in run:
        rows.append(one_call(op, name, shape, reps, reference)[0])
    for r in rows:
        r.live_rows = live if r.status != "skipped" else None
        if r.measured:
            seconds_per_token[(op_name, r.provider)] = r.median_ms / 1e3 / tokens
    return rows, "eager" if fits else "eager in row blocks"


def one_call(op, name: str, shape: dict, reps: int, reference: dict | None):
    """`name` at one point in a fresh process: its first call gives the peak extra memory, the time and the
    outputs checked against `reference` here; `reps - 1` more calls are timed. With no reference the provider
    is the reference: its row is "ref" and its outputs come back. Returns (row, outputs or None)."""
    res = Result(op.name, name, "fwd+bwd", dict(shape), "fp32", status="ok")
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "outputs.pt")
        spec = dict(op=op.name, provider=name, shape=shape, dtype="fp32", mode="fwd+bwd", seed=SEED, reps=reps)
        child = cpu_peak_in_subprocess(dict(spec, outputs_path=path), timeout_s=CHILD_TIMEOUT_S)
        if "error" in child:
            oom = any(word in child["error"] for word in OOM_WORDS)
            res.status, res.note = ("OOM" if oom else "error"), child["error"]
            return res, None
        outputs = torch.load(path)
    res.median_ms, res.p20_ms, res.p80_ms = quantiles([s * 1e3 for s in child["seconds"]])
    res.reps = len(child["seconds"])
    res.peak_mib = child["peak_bytes"] / 2**20
    res.extra_mib = (child["peak_bytes"] - child["grad_bytes"]) / 2**20
    if reference is None:
        res.status, res.errors = "ref", {k: 0.0 for k in outputs}
        return res, outputs
    res.errors = {k: relative_error(outputs[k], reference[k]) for k in outputs}
    bad = {k: e for k, e in res.errors.items() if not e <= REL_TOL[torch.float32]}
    if bad:
        res.status = "FAIL"
        res.note = "; ".join(f"{k} rel err {e:.2e}" for k, e in bad.items())
    return res, None


def sweep(ops, providers, tokens, d, v, limits, reps, stop_by: float, on_point) -> None:
    """Every (tokens, op) point in order, smallest first; after `stop_by` (epoch seconds) the points left are
    skipped rows. `on_point(rows, reference_label)` receives each point's rows as they come."""
    seconds_per_token: dict = {}
    for n in tokens:
        for op_name in ops:
            if time.time() > stop_by:
                shape = shape_at(op_name, n, d, v)
                rows = [
                    _skipped(op_name, p, shape, "not measured: the run's time budget ran out")
                    for p in providers[op_name]
                ]
                on_point(rows, "none")
                continue
            on_point(*sweep_point(op_name, providers[op_name], n, d, v, limits, seconds_per_token, reps))
