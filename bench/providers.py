"""Who gets benchmarked: eager PyTorch, torch.compile of it, fastrl's two paths, and third parties.

A provider is a name, a function with the op's signature, and a test that says why it cannot run on a
device (None when it can). The peers (TRL, Liger-Kernel, Cut Cross-Entropy; bench/peers.py) run their own
installed code and are reported n/a, with the reason, when their package is missing (`pip install
fastrl[bench]` installs them). Baselines come from the package's own eager references
(`fastrl.kernels.token_logprobs_reference`), never re-implemented here. `blas-floor` is no
implementation: it times the three GEMMs of the shape (6·N·D·V) and skips the correctness check.
`recompute-floor` is the same with the forward GEMM done again in the backward (8·N·D·V): the least a
log-prob op that keeps no `[N, V]` tensor between forward and backward must do.
"""

import importlib.util
import os
from dataclasses import dataclass
from typing import Callable

import torch

import fastrl
from bench.peers import cce_token_logprobs, liger_grpo_loss, trl_grpo_loss, trl_token_logprobs
from fastrl.kernels import LogprobParams, token_logprobs_reference


@dataclass(frozen=True)
class Provider:
    name: str
    fn: Callable
    unavailable: Callable[[torch.device], str | None]  # the reason it cannot run there, or None
    compiles: bool = False  # the first call compiles: warm up at the full shape before measuring memory
    floor: bool = False  # a lower bound to time (no correct outputs): not checked against the reference


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


class _GemmFloor(torch.autograd.Function):
    """The three GEMMs of a fused LM-head op and nothing else: z = h·Wᵀ, then z·W and zᵀ·h."""

    @staticmethod
    def forward(ctx, hidden, weight):
        h2 = hidden.reshape(-1, hidden.shape[-1])
        z = h2 @ weight.T
        ctx.save_for_backward(h2, weight, z)
        ctx.hidden_shape = hidden.shape
        return z.new_zeros(h2.shape[0])

    @staticmethod
    def backward(ctx, grad):
        h2, weight, z = ctx.saved_tensors
        return (z @ weight).reshape(ctx.hidden_shape), z.T @ h2


class _RecomputeFloor(torch.autograd.Function):
    """Four GEMMs: z = h·Wᵀ in the forward, and in the backward z again, then z·W and zᵀ·h."""

    @staticmethod
    def forward(ctx, hidden, weight):
        h2 = hidden.reshape(-1, hidden.shape[-1])
        z = h2 @ weight.T
        ctx.save_for_backward(h2, weight)
        ctx.hidden_shape = hidden.shape
        return z.new_zeros(h2.shape[0])

    @staticmethod
    def backward(ctx, grad):
        h2, weight = ctx.saved_tensors
        z = h2 @ weight.T
        return (z @ weight).reshape(ctx.hidden_shape), z.T @ h2


def floor_token_logprobs(hidden, weight, targets):
    return _GemmFloor.apply(hidden, weight)


def recompute_floor_token_logprobs(hidden, weight, targets):
    return _RecomputeFloor.apply(hidden, weight)


TOKEN_LOGPROBS_PROVIDERS = {
    "eager": Provider("eager", eager_token_logprobs, always),
    "compile": Provider("compile", compile_failure(eager_token_logprobs), always, compiles=True),
    "fastrl-torch": Provider("fastrl-torch", fastrl_torch_token_logprobs, always),
    "fastrl-triton": Provider("fastrl-triton", fastrl_triton_token_logprobs, triton_unavailable, compiles=True),
    "cce": Provider("cce", cce_token_logprobs, package_unavailable("cut_cross_entropy", cuda_only=False), True),
    "trl": Provider("trl", trl_token_logprobs, package_unavailable("trl", cuda_only=False)),
    "blas-floor": Provider("blas-floor", floor_token_logprobs, always, floor=True),
    "recompute-floor": Provider("recompute-floor", recompute_floor_token_logprobs, always, floor=True),
}


# ---- grpo_loss: fn(hidden [B, T, D], weight, targets [B, T], mask, advantages [B], old, ref, config) -> loss ----


def eager_grpo_loss(hidden, weight, targets, mask, advantages, old, ref, config):
    """What eager RL code does: full logits → log-probs (the package's reference) → the per-token loss."""
    b, t, d = hidden.shape
    need_entropy = config.entropy_coef != 0
    params = LogprobParams(config.temperature, -100, need_entropy)
    live = torch.where(mask, targets, torch.full_like(targets, -100))
    logp, entropy = token_logprobs_reference(hidden.reshape(-1, d), weight, live.reshape(-1), None, params)
    entropy = None if entropy is None else entropy.reshape(b, t)
    out = fastrl.policy_loss(
        logp.reshape(b, t),
        advantages,
        mask,
        old_logprobs=old,
        ref_logprobs=ref,
        entropy=entropy,
        config=config,
        impl="torch",
    )
    return out.loss


def fastrl_grpo_loss(impl: str) -> Callable:
    def fn(hidden, weight, targets, mask, advantages, old, ref, config):
        return fastrl.grpo_loss(
            hidden, weight, targets, mask, advantages, old_logprobs=old, ref_logprobs=ref, config=config, impl=impl
        ).loss

    return fn


def fastrl_recompute_grpo_loss(hidden, weight, targets, mask, advantages, old, ref, config):
    """fastrl's two-pass path: token_logprobs (its backward recomputes the tiles), then policy_loss."""
    need_entropy = config.entropy_coef != 0
    live = torch.where(mask, targets, torch.full_like(targets, -100))
    out = fastrl.token_logprobs(
        hidden, weight, live, temperature=config.temperature, return_entropy=need_entropy, impl="torch"
    )
    logp, entropy = out if need_entropy else (out, None)
    return fastrl.policy_loss(
        logp, advantages, mask, old_logprobs=old, ref_logprobs=ref, entropy=entropy, config=config, impl="torch"
    ).loss


def cce_grpo_loss(hidden, weight, targets, mask, advantages, old, ref, config):
    """Cut Cross-Entropy's per-token log-probs, then the per-token loss formula eager uses."""
    if config.entropy_coef != 0:
        raise ValueError(f"Cut Cross-Entropy returns no entropy: entropy_coef={config.entropy_coef} cannot run")
    b, t, d = hidden.shape
    h = hidden if config.temperature == 1.0 else hidden / config.temperature  # (h/τ)·Wᵀ = z/τ
    live = torch.where(mask, targets, torch.full_like(targets, -100))
    logp = cce_token_logprobs(h.reshape(-1, d), weight, live.reshape(-1)).view(b, t)
    return fastrl.policy_loss(
        logp, advantages, mask, old_logprobs=old, ref_logprobs=ref, config=config, impl="torch"
    ).loss


def floor_grpo_loss(hidden, weight, targets, mask, advantages, old, ref, config):
    return _GemmFloor.apply(hidden, weight).sum()


GRPO_LOSS_PROVIDERS = {
    "eager": Provider("eager", eager_grpo_loss, always),
    "compile": Provider("compile", compile_failure(eager_grpo_loss), always, compiles=True),
    "fastrl-torch": Provider("fastrl-torch", fastrl_grpo_loss("torch"), always),
    "fastrl-triton": Provider("fastrl-triton", fastrl_grpo_loss("triton"), triton_unavailable, compiles=True),
    "fastrl-recompute": Provider("fastrl-recompute", fastrl_recompute_grpo_loss, always),
    "trl": Provider("trl", trl_grpo_loss, package_unavailable("trl", cuda_only=False)),
    "liger": Provider("liger", liger_grpo_loss, package_unavailable("liger_kernel", cuda_only=False), True),
    "cce": Provider("cce", cce_grpo_loss, package_unavailable("cut_cross_entropy", cuda_only=False), True),
    "blas-floor": Provider("blas-floor", floor_grpo_loss, always, floor=True),
}
