"""Who gets benchmarked: eager PyTorch, torch.compile of it, fastrl's two paths, and third parties.

A provider is a name, a function with the op's signature, and a test that says why it cannot run on a
device (None when it can). Third-party providers (Cut Cross-Entropy, Liger-Kernel) appear only when
their package imports; nothing is installed for them. Baselines come from the package's own eager
references (`fastrl.kernels.token_logprobs_reference`), never re-implemented here.
"""

import importlib.util
import os
from dataclasses import dataclass
from typing import Callable

import torch

import fastrl
from fastrl.kernels import LogprobParams, token_logprobs_reference


@dataclass(frozen=True)
class Provider:
    name: str
    fn: Callable
    unavailable: Callable[[torch.device], str | None]  # the reason it cannot run there, or None
    compiles: bool = False  # the first call compiles: warm up at the full shape before measuring memory


def always(device: torch.device) -> str | None:
    return None


def triton_unavailable(device: torch.device) -> str | None:
    if device.type != "cuda":
        return "n/a on CPU: Triton runs on CPU only under its interpreter, far too slow to time"
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return "TRITON_INTERPRET=1 is set: the interpreter would be timed, not the GPU kernel"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if importlib.util.find_spec("fastrl.kernels.triton_function") is None:
        return "fastrl has no Triton path in this checkout (fastrl/kernels/triton_function.py missing)"
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


def cce_token_logprobs(hidden, weight, targets):
    from cut_cross_entropy import linear_cross_entropy

    # per-token cross-entropy is −logp; ignored rows give 0 either way
    return -linear_cross_entropy(hidden, weight, targets, reduction="none").float()


TOKEN_LOGPROBS_PROVIDERS = {
    "eager": Provider("eager", eager_token_logprobs, always),
    "compile": Provider("compile", compile_failure(eager_token_logprobs), always, compiles=True),
    "fastrl-torch": Provider("fastrl-torch", fastrl_torch_token_logprobs, always),
    "fastrl-triton": Provider("fastrl-triton", fastrl_triton_token_logprobs, triton_unavailable, compiles=True),
    "cce": Provider("cce", cce_token_logprobs, package_unavailable("cut_cross_entropy", cuda_only=True), True),
}
