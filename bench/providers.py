"""Who gets benchmarked: eager PyTorch, torch.compile of it, fastrl's paths, and third parties.

A provider is a name, a function with the op's signature, and a test that says why it cannot run on a
device (None when it can). The peers (TRL, Liger-Kernel, Cut Cross-Entropy, PyTorch's own chunked
`linear_cross_entropy`; bench/peers.py) run their own installed code and are reported n/a, with the reason,
when their package is missing (`pip install fastrl[bench]` installs them). Every provider does the same
work: the peers and the floors get the live rows only (`on_live_rows`), fastrl gets every row and leaves
the ignored ones out itself; `trl-all-rows` is TRL as its trainer calls it on a device without Triton
(every row scored), a separate, labelled row. Baselines come from the package's own eager references
(`fastrl.kernels.token_logprobs_reference`), never re-implemented here. The floors (bench/floors.py) are
no implementations: they time the GEMMs alone and skip the correctness check.
"""

import importlib.util
import os
from dataclasses import dataclass
from typing import Callable

import torch

import fastrl
from bench.floors import blas_floor, recompute_floor
from bench.peers import cce_token_logprobs, torch_lce_token_logprobs, trl_token_logprobs
from fastrl.kernels import LogprobParams, token_logprobs_reference


@dataclass(frozen=True)
class Provider:
    name: str
    fn: Callable
    unavailable: Callable[[torch.device], str | None]  # the reason it cannot run there, or None
    compiles: bool = False  # the first call compiles: warm up at the full shape before measuring memory
    floor: bool = False  # a lower bound to time (no correct outputs): not checked against the reference
    recomputes: bool = False  # recomputes the logits; recompute-floor binds it by this flag when memory is unmeasured
    all_rows: bool = False  # scores every row, the ignored ones too: more work than the live rows fastrl scores


def always(device: torch.device) -> str | None:
    return None


def triton_unavailable(device: torch.device) -> str | None:
    if device.type != "cuda":
        return "n/a on CPU: Triton runs on CPU only under its interpreter, far too slow to time"
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return "TRITON_INTERPRET=1 is set: the interpreter would be timed, not the GPU kernel"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if importlib.util.find_spec("fastrl.kernels.logprobs.fwd") is None:
        return "fastrl has no Triton path in this checkout (fastrl/kernels/logprobs/fwd.py missing)"
    return None


def package_unavailable(module: str, cuda_only: bool) -> Callable[[torch.device], str | None]:
    def check(device: torch.device) -> str | None:
        if importlib.util.find_spec(module.split(".")[0]) is None:
            return f"{module.split('.')[0]} is not installed"
        if cuda_only and device.type != "cuda":
            return f"{module.split('.')[0]} needs CUDA"
        return None

    return check


def compile_failure(fn: Callable) -> Callable:
    """torch.compile(fn), re-raising a compiler failure with a one-line cause (it is reported, not hidden)."""
    compiled = torch.compile(fn)

    def run(*args):
        try:
            return compiled(*args)
        except Exception as exc:  # inductor raises many types; the bench records the message as "error"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RuntimeError(f"torch.compile failed: {type(exc).__name__}: {first[:200]}") from exc

    return run


# ---- token_logprobs: fn(hidden [N, D], weight [V, D], targets [N]) -> logp [N] float32 ----

_PARAMS = LogprobParams()


def eager_token_logprobs(hidden, weight, targets):
    return token_logprobs_reference(hidden, weight, targets, None, _PARAMS)[0]


def fastrl_torch_token_logprobs(hidden, weight, targets):
    return fastrl.token_logprobs(hidden, weight, targets, impl="torch")


def fastrl_triton_token_logprobs(hidden, weight, targets):
    return fastrl.token_logprobs(hidden, weight, targets, impl="triton")


def on_live_rows(fn: Callable) -> Callable:
    """`fn(hidden[live], weight, targets[live])` scattered back to `[N]` (zeros at ignored rows): the work a
    careful user gives a log-prob op (TRL does the same on Triton devices), so every provider scores the same
    rows fastrl scores."""

    def run(hidden, weight, targets):
        rows = torch.nonzero(targets != -100).squeeze(-1)
        out = fn(hidden.index_select(0, rows), weight, targets.index_select(0, rows))
        return out.new_zeros(targets.shape[0]).index_copy(0, rows, out)

    return run


def floor_token_logprobs(hidden, weight, targets):
    return blas_floor(hidden, weight)


def recompute_floor_token_logprobs(hidden, weight, targets):
    return recompute_floor(hidden, weight)


_LIVE_EAGER = on_live_rows(eager_token_logprobs)
TOKEN_LOGPROBS_PROVIDERS = {
    "eager": Provider("eager", _LIVE_EAGER, always),
    "compile": Provider("compile", on_live_rows(compile_failure(eager_token_logprobs)), always, compiles=True),
    "fastrl-torch": Provider("fastrl-torch", fastrl_torch_token_logprobs, always, recomputes=True),
    "fastrl-triton": Provider("fastrl-triton", fastrl_triton_token_logprobs, triton_unavailable, compiles=True),
    # CCE's CPU path (impl="torch_compile") keeps the [N, V] logits; on CUDA (impl="cce") it recomputes them,
    # which the verdict sees from the measured memory (bench/verdict.py recompute_bound)
    "cce": Provider("cce", on_live_rows(cce_token_logprobs), package_unavailable("cut_cross_entropy", False), True),
    "torch-lce": Provider("torch-lce", on_live_rows(torch_lce_token_logprobs), always, recomputes=True),
    "trl": Provider("trl", on_live_rows(trl_token_logprobs), package_unavailable("trl", False), recomputes=True),
    "trl-all-rows": Provider(
        "trl-all-rows", trl_token_logprobs, package_unavailable("trl", False), recomputes=True, all_rows=True
    ),
    "blas-floor": Provider("blas-floor", on_live_rows(floor_token_logprobs), always, compiles=True, floor=True),
    "recompute-floor": Provider(
        "recompute-floor", on_live_rows(recompute_floor_token_logprobs), always, compiles=True, floor=True
    ),
}
PEERS = ("eager", "compile", "cce", "torch-lce", "trl", "trl-all-rows", "liger")
