"""Benchmark of `fastrl.grpo_loss` (hidden states → GRPO loss, fwd+bwd) against eager PyTorch.

The eager baseline is what RL trainers do today: full `[B·T, V]` logits through the package's
reference (`fastrl.kernels.token_logprobs_reference`), then the same per-token policy loss
(`fastrl.policy_loss`, torch path). Settings are TRL-like: `loss_agg="token-mean"` (TRL's "bnpo"),
β = 0.04 with reference log-probs, off-policy old log-probs near the current ones so some tokens clip;
completion lengths uniform in [T/2, T], so about 3/4 of the positions are live. Every peer scores the live
positions only (bench/providers_grpo.py). FLOPs: 8·N·D·V for fwd+bwd (forward + recomputing backward);
fastrl's gradient-in-forward path does 6·(live tokens)·D·V, which `blas-floor` (three GEMMs over the live
positions) bounds from below.
"""

import torch

from bench.providers_grpo import GRPO_LOSS_PROVIDERS
from fastrl import LossConfig
from fastrl.kernels import LogprobParams, token_logprobs_reference

LOGIT_STD = 2.0
REF_CHUNK = 4096  # rows per eager call when building the inputs' old / ref log-probs
CONFIG = LossConfig(loss_agg="token-mean", beta=0.04)

CPU_QUICK = [dict(B=2, T=t, D=128, V=32768) for t in (256, 512)]
CPU_FULL = [dict(B=8, T=t, D=512, V=32768) for t in (128, 256, 512)]
# the headline CPU point (--acceptance): fp32 fwd+bwd; target extra memory ≥ 10× below eager's
ACCEPTANCE = dict(B=8, T=1024, D=512, V=32768)
ACCEPTANCE_PROVIDERS = [
    "eager", "compile", "fastrl-torch", "fastrl-recompute", "trl", "trl-all-rows", "liger", "cce", "torch-lce",
    "blas-floor",
]  # fmt: skip
GPU_SWEEP = [
    dict(B=8, T=1024, D=4096, V=151936),
    dict(B=16, T=1024, D=4096, V=151936),
    dict(B=8, T=1024, D=2048, V=128256),
]
GPU_COMPILE_SHAPES = [dict(B=8, T=1024, D=2048, V=128256)]


class GrpoLossOp:
    name = "grpo_loss"
    baseline = "eager"
    budget_share = 0.3  # of the run budget (GPU: 210 s)
    providers = GRPO_LOSS_PROVIDERS
    tiny_shape = dict(B=2, T=32, D=64, V=512)

    def plan(self, device: torch.device, quick: bool, acceptance: bool) -> list[tuple[dict, str, list, list]]:
        names = list(self.providers)
        if acceptance:
            return [(ACCEPTANCE, "fp32", ACCEPTANCE_PROVIDERS, ["fwd+bwd"])]
        if device.type == "cuda":
            no_compile = [p for p in names if p != "compile"]
            return [(s, "bf16", names if s in GPU_COMPILE_SHAPES else no_compile, ["fwd+bwd"]) for s in GPU_SWEEP]
        return [(s, "fp32", names, ["fwd+bwd"]) for s in (CPU_QUICK if quick else CPU_FULL)]

    def make_inputs(self, shape: dict, dtype: torch.dtype, device: torch.device, seed: int) -> dict:
        b, t, d, v = shape["B"], shape["T"], shape["D"], shape["V"]
        gen = torch.Generator(device=device).manual_seed(seed)
        hidden = torch.randn(b, t, d, device=device, generator=gen).to(dtype)
        weight = (torch.randn(v, d, device=device, generator=gen) * (LOGIT_STD / d**0.5)).to(dtype)
        targets = torch.randint(0, v, (b, t), device=device, generator=gen)
        lengths = torch.randint(t // 2, t + 1, (b, 1), device=device, generator=gen)
        mask = torch.arange(t, device=device)[None, :] < lengths
        advantages = torch.randn(b, device=device, generator=gen)
        logp = torch.empty(b * t, device=device)
        with torch.no_grad():
            flat_h, flat_t = hidden.reshape(-1, d), targets.reshape(-1)
            for start in range(0, b * t, REF_CHUNK):
                sl = slice(start, start + REF_CHUNK)
                logp[sl] = token_logprobs_reference(flat_h[sl], weight, flat_t[sl], None, LogprobParams())[0]
        old = logp.reshape(b, t) + 0.1 * torch.randn(b, t, device=device, generator=gen)
        ref = old + 0.05 * torch.randn(b, t, device=device, generator=gen)
        return {
            "hidden": hidden.requires_grad_(),
            "weight": weight.requires_grad_(),
            "rest": (targets, mask, advantages, old, ref, CONFIG),
        }

    def closure(self, provider, inputs: dict, mode: str, upstream: str):
        h, w, rest = inputs["hidden"], inputs["weight"], inputs["rest"]
        if mode == "fwd":

            def fwd():
                with torch.no_grad():
                    return {"loss": provider.fn(h, w, *rest)}

            return fwd
        if mode == "fwd+bwd":

            def fwd_bwd():
                loss = provider.fn(h, w, *rest)
                dh, dw = torch.autograd.grad(loss, (h, w))
                return {"loss": loss.detach(), "hidden.grad": dh, "weight.grad": dw}

            return fwd_bwd
        raise ValueError(f"grpo_loss modes are fwd and fwd+bwd, got {mode!r}")

    def reference(self, inputs: dict) -> dict:
        return self.closure(self.providers[self.baseline], inputs, "fwd+bwd", "check")()

    def live_rows(self, inputs: dict) -> int:
        return int(inputs["rest"][1].sum())  # the mask

    def grad_bytes(self, inputs: dict, mode: str) -> int:
        if mode == "fwd":
            return 0
        return sum(inputs[k].numel() * inputs[k].element_size() for k in ("hidden", "weight"))

    def flops(self, shape: dict, mode: str) -> float:
        ndv = shape["B"] * shape["T"] * shape["D"] * shape["V"]
        return {"fwd": 2, "fwd+bwd": 8}[mode] * ndv

    def matmul_dims(self, shape: dict) -> tuple[int, int, int]:
        return shape["B"] * shape["T"], shape["D"], shape["V"]


OP = GrpoLossOp()
