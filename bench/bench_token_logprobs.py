"""Benchmark of `fastrl.token_logprobs` (hidden states + LM head → per-token log-prob) against eager.

Modes: "fwd" runs under `torch.no_grad()` (how reference / old log-probs are computed); "fwd+bwd"
is forward plus `autograd.grad` for hidden and weight with a random upstream gradient; "bwd" times
only the backward of a forward done beforehand. FLOPs are the docs/math.md §1 floor — 2·N·D·V forward,
6·N·D·V backward, 8·N·D·V both — the same nominal count for every provider, so TFLOP/s compares
times and not how much work each provider chose to do.
"""

import torch

from bench.providers import TOKEN_LOGPROBS_PROVIDERS
from fastrl.kernels import LogprobParams, token_logprobs_reference

IGNORE_INDEX = -100
IGNORED_FRACTION = 0.05  # some prompt / padding rows in every batch, as in real RL batches
CHECK_ROWS = 4096  # above this many tokens, gradients are checked on a random subset of rows
LOGIT_STD = 2.0  # scale of the random logits: a peaked but not degenerate softmax

CPU_QUICK = [dict(N=n, D=128, V=32768) for n in (256, 512, 1024, 2048)]
CPU_FULL = [dict(N=n, D=512, V=32768) for n in (1024, 2048, 4096)]
# the headline CPU point (--acceptance): impl="torch", fp32 fwd+bwd; its targets are bench/__main__.py's
ACCEPTANCE = dict(N=8192, D=512, V=32768)
ACCEPTANCE_PROVIDERS = [
    "eager", "compile", "fastrl-torch", "trl", "trl-all-rows", "cce", "torch-lce", "blas-floor", "recompute-floor",
]  # fmt: skip
# GPU, bf16, most important first (the run stops at its time budget): the speed-target shape
# D=4096 / V≈152k over N, then model-like (D, V) pairs: Qwen2.5-0.5B, Llama-3.2-1B, Mistral-7B.
GPU_SWEEP = [dict(N=n, D=4096, V=151936) for n in (4096, 16384, 32768, 1024)] + [
    dict(N=8192, D=896, V=151936),
    dict(N=8192, D=2048, V=128256),
    dict(N=8192, D=4096, V=32768),
]
GPU_COMPILE_SHAPES = [dict(N=8192, D=2048, V=128256)]  # inductor compiles per shape: keep to one


class Backward:
    """The "bwd" mode: `prepare()` runs the forward, the call runs only the backward and frees the graph
    (no `retain_graph`, which compiled backwards with donated buffers refuse)."""

    def __init__(self, forward, inputs: tuple, upstream: torch.Tensor):
        self.forward, self.inputs, self.upstream = forward, inputs, upstream
        self.out = None

    def prepare(self) -> None:
        self.out = self.forward()

    def __call__(self) -> dict:
        if self.out is None:
            self.prepare()
        out, self.out = self.out, None
        dh, dw = torch.autograd.grad(out, self.inputs, self.upstream)
        return {"hidden.grad": dh, "weight.grad": dw}


class TokenLogprobsOp:
    name = "token_logprobs"
    baseline = "eager"
    budget_share = 0.7  # of the run budget (GPU: 210 s)
    tiny_shape = dict(N=64, D=64, V=512)  # warm-up shape for the memory subprocess
    providers = TOKEN_LOGPROBS_PROVIDERS

    def plan(self, device: torch.device, quick: bool, acceptance: bool) -> list[tuple[dict, str, list, list]]:
        """(shape, dtype, providers, modes) in run order."""
        names = list(self.providers)
        if acceptance:
            return [(ACCEPTANCE, "fp32", ACCEPTANCE_PROVIDERS, ["fwd+bwd"])]
        if device.type == "cuda":
            no_compile = [p for p in names if p != "compile"]
            return [
                (s, "bf16", names if s in GPU_COMPILE_SHAPES else no_compile, ["fwd", "fwd+bwd"]) for s in GPU_SWEEP
            ]
        if quick:
            return [(s, "fp32", names, ["fwd", "fwd+bwd"]) for s in CPU_QUICK]
        return [(s, "fp32", names, ["fwd", "bwd", "fwd+bwd"]) for s in CPU_FULL]

    def make_inputs(self, shape: dict, dtype: torch.dtype, device: torch.device, seed: int) -> dict:
        n, d, v = shape["N"], shape["D"], shape["V"]
        gen = torch.Generator(device=device).manual_seed(seed)
        hidden = torch.randn(n, d, device=device, generator=gen).to(dtype)
        weight = (torch.randn(v, d, device=device, generator=gen) * (LOGIT_STD / d**0.5)).to(dtype)
        targets = torch.randint(0, v, (n,), device=device, generator=gen)
        targets[torch.rand(n, device=device, generator=gen) < IGNORED_FRACTION] = IGNORE_INDEX
        grad_time = torch.randn(n, device=device, generator=gen)
        rows = torch.arange(n, device=device)
        if n > CHECK_ROWS:
            rows = torch.randperm(n, device=device, generator=gen)[:CHECK_ROWS].sort().values
        grad_check = torch.zeros_like(grad_time)
        grad_check[rows] = grad_time[rows]
        return {
            "hidden": hidden.requires_grad_(),
            "weight": weight.requires_grad_(),
            "targets": targets,
            "time": grad_time,
            "check": grad_check,
            "check_rows": rows,
        }

    def closure(self, provider, inputs: dict, mode: str, upstream: str):
        """One iteration of `mode` as a no-argument callable returning the tensors to check. For "bwd" the
        callable has a `prepare()` the harness runs untimed before each call (the forward)."""
        h, w, t, g = inputs["hidden"], inputs["weight"], inputs["targets"], inputs[upstream]
        if mode == "fwd":

            def fwd():
                with torch.no_grad():
                    return {"logp": provider.fn(h, w, t)}

            return fwd
        if mode == "fwd+bwd":

            def fwd_bwd():
                logp = provider.fn(h, w, t)
                dh, dw = torch.autograd.grad(logp, (h, w), g)
                return {"logp": logp.detach(), "hidden.grad": dh, "weight.grad": dw}

            return fwd_bwd
        if mode == "bwd":
            return Backward(lambda: provider.fn(h, w, t), (h, w), g)
        raise ValueError(f"mode must be fwd, bwd or fwd+bwd, got {mode!r}")

    def reference(self, inputs: dict) -> dict:
        """Eager log-probs for every row and gradients for the `check` upstream, which is zero outside
        `check_rows`: those rows alone then give the exact full-batch gradient, at a fraction of the
        eager memory when N is large."""
        h, w, t, rows = inputs["hidden"], inputs["weight"], inputs["targets"], inputs["check_rows"]
        params = LogprobParams()
        h_rows = h.detach()[rows].requires_grad_()
        w_ref = w.detach().requires_grad_()
        logp_rows = token_logprobs_reference(h_rows, w_ref, t[rows], None, params)[0]
        d_rows, dw = torch.autograd.grad(logp_rows, (h_rows, w_ref), inputs["check"][rows])
        dh = torch.zeros_like(h)
        dh[rows] = d_rows
        if rows.numel() == t.numel():
            logp = logp_rows.detach()
        else:
            logp = torch.empty(t.numel(), dtype=torch.float32, device=h.device)
            with torch.no_grad():
                for start in range(0, t.numel(), CHECK_ROWS):
                    sl = slice(start, start + CHECK_ROWS)
                    logp[sl] = token_logprobs_reference(h[sl], w, t[sl], None, params)[0]
        return {"logp": logp, "hidden.grad": dh, "weight.grad": dw}

    def live_rows(self, inputs: dict) -> int:
        return int((inputs["targets"] != IGNORE_INDEX).sum())

    def grad_bytes(self, inputs: dict, mode: str) -> int:
        if mode == "fwd":
            return 0
        return sum(inputs[k].numel() * inputs[k].element_size() for k in ("hidden", "weight"))

    def flops(self, shape: dict, mode: str) -> float:
        ndv = shape["N"] * shape["D"] * shape["V"]
        return {"fwd": 2, "bwd": 6, "fwd+bwd": 8}[mode] * ndv

    def matmul_dims(self, shape: dict) -> tuple[int, int, int]:
        return shape["N"], shape["D"], shape["V"]


OP = TokenLogprobsOp()
