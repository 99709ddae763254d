"""The PyTorch walks' chunk budgets and the one reader of FASTRL_CHUNK_BYTES, in one place.

Apart from configs.py (the Triton launch constants) because the PyTorch walks run where triton is not installed
(a CPU-only or a peer's environment), and configs.py imports it.
"""

import os

__all__ = [
    "CHUNK_MAX_BYTES",
    "CHUNK_MIN_BYTES",
    "FUSED_CPU_CHUNK_BYTES",
    "FUSED_GPU_CHUNK_BYTES",
    "FUSED_MIN_ROWS",
    "INVARIANT_MAX_ROWS",
    "REPLAY_PAIR_BYTES",
    "chunk_budget",
    "replay_pair_bytes",
]

# The PyTorch walks' tile budgets, in bytes of one float32 tile. FASTRL_CHUNK_BYTES (read by `chunk_budget` alone)
# overrides the logit tiles' budget of every walk; without it the log-prob walks take 1/8 of the full logits within
# [CHUNK_MIN_BYTES, CHUNK_MAX_BYTES] (larger tiles run the GEMMs faster; 1/8 keeps a small batch's tiles small) and
# the gradient-in-forward walk a fixed budget per device, never under FUSED_MIN_ROWS rows (each of its chunks reads
# and writes the whole [V, D] float32 d_weight, so its GEMM needs an inner dim of a few hundred to stay
# compute-bound). The replay walk's [pairs, D] gather buffers are fixed (never scaled by N): REPLAY_PAIR_BYTES, or
# FASTRL_REPLAY_CHUNK_BYTES.
CHUNK_MIN_BYTES = 32 * 2**20
CHUNK_MAX_BYTES = 128 * 2**20
FUSED_CPU_CHUNK_BYTES = 64 * 2**20  # 512 rows at V = 32k: MKL's three GEMMs as fast as at 1024-2048, half the memory
FUSED_GPU_CHUNK_BYTES = 2**31
FUSED_MIN_ROWS = 256
INVARIANT_MAX_ROWS = 1024  # the batch-invariant torch walks' block rows, at most
REPLAY_PAIR_BYTES = 4 * 2**20


def _bytes_from_env(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    if not value.strip().isdigit() or int(value) <= 0:
        raise ValueError(f"{name} must be a positive number of bytes, got {value!r}")
    return int(value)


def chunk_budget() -> int | None:
    """FASTRL_CHUNK_BYTES: the logit tile budget every PyTorch walk takes when it is set, None when it is not."""
    return _bytes_from_env("FASTRL_CHUNK_BYTES")


def replay_pair_bytes() -> int:
    """Bytes of one float32 `[pairs, D]` gather buffer of the replay walk: FASTRL_REPLAY_CHUNK_BYTES, or 4 MiB."""
    budget = _bytes_from_env("FASTRL_REPLAY_CHUNK_BYTES")
    return REPLAY_PAIR_BYTES if budget is None else budget
