"""Every `triton.Config` of the token-log-prob kernels, in one place.

Each kernel has one known-good default per GPU generation (sm_80: A100, sm_90: H100/H200); the
compile test builds each of them for both targets and checks for register spills and tensor-core
instructions. `FASTRL_AUTOTUNE=1` opts into autotuning over `AUTOTUNE_CONFIGS` instead, keyed on
the token count rounded up to a power of two (so a new N in the same bucket does not re-tune).
"""

import os

import torch
import triton

# Bytes of the `[N, V_chunk]` gradient-of-logits slab the backward writes per vocab chunk.
BWD_SLAB_BYTES = int(os.environ.get("FASTRL_BWD_SLAB_BYTES", 2**30))

# Programs the forward aims to launch (times the SM count) before it splits the vocab.
FWD_WAVES = 2


def _cfg(block_n, block_v, block_d, num_warps, num_stages):
    return triton.Config(
        {"BLOCK_N": block_n, "BLOCK_V": block_v, "BLOCK_D": block_d}, num_warps=num_warps, num_stages=num_stages
    )


# 128x128 logit tiles with a 64-wide K step: tensor-core sized, the fp32 tile is 64 registers per
# thread at 8 warps, which leaves room for the softmax epilogue without spilling.
DEFAULT_CONFIGS = {
    "logprob_fwd": {80: _cfg(128, 128, 64, 8, 3), 90: _cfg(128, 128, 64, 8, 4)},
    "logprob_dz": {80: _cfg(128, 128, 64, 8, 3), 90: _cfg(128, 128, 64, 8, 4)},
}

AUTOTUNE_CONFIGS = {
    name: [
        _cfg(bn, bv, bd, w, s)
        for bn, bv in ((64, 128), (128, 128), (128, 256), (256, 128))
        for bd in (32, 64)
        for w, s in ((4, 3), (8, 3), (8, 4))
    ]
    for name in DEFAULT_CONFIGS
}


def autotune_enabled() -> bool:
    return os.environ.get("FASTRL_AUTOTUNE", "0") == "1"


def arch_of(device: torch.device) -> int:
    """80 or 90: the generation whose default config fits `device` (the CPU interpreter gets 90's)."""
    if device.type != "cuda":
        return 90
    major, _ = torch.cuda.get_device_capability(device)
    return 90 if major >= 9 else 80


def default_config(kernel: str, device: torch.device) -> triton.Config:
    return DEFAULT_CONFIGS[kernel][arch_of(device)]


def token_bucket(n: int) -> int:
    """The autotune key for a token count: the next power of two (at least 256)."""
    return max(256, triton.next_power_of_2(max(n, 1)))


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


_TUNED = {}


def kernel_and_kwargs(kernel: str, jit_fn, key: list[str], device: torch.device):
    """The kernel to launch and its config kwargs: the default, or an autotuner (then no kwargs)."""
    if autotune_enabled():
        if kernel not in _TUNED:
            _TUNED[kernel] = triton.autotune(configs=AUTOTUNE_CONFIGS[kernel], key=key)(jit_fn)
        return _TUNED[kernel], {}
    cfg = default_config(kernel, device)
    return jit_fn, {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


def poison_outputs() -> bool:
    """FASTRL_POISON=1 fills kernel outputs with NaN before launch (tests: an unwritten element fails)."""
    return os.environ.get("FASTRL_POISON", "0") == "1"


def alloc(shape, dtype, device) -> torch.Tensor:
    if poison_outputs():
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)
