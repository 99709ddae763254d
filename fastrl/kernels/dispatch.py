"""Which implementation runs: maps `impl` ("auto", "triton", "torch") to a function, for every op.

The Triton modules are imported only when the Triton path is chosen: triton is an optional dependency,
and the torch paths must import and run without it.
"""

import os

import torch

__all__ = ["IMPLS", "interpreter_on", "policy_rows_impl", "resolve_impl", "token_logprobs_impl", "triton_available"]

IMPLS = ("auto", "triton", "torch")


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve_impl(impl: str, device: torch.device) -> str:
    """Map `impl` to "triton" or "torch" for tensors on `device`, or raise a ValueError naming it."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if impl == "triton":
        if not triton_available():
            raise ValueError("impl='triton' needs the triton package, which is not installed")
        if device.type != "cuda" and not interpreter_on():
            raise ValueError(
                f"impl='triton' on a {device.type} tensor needs TRITON_INTERPRET=1 set before triton "
                "is imported; use impl='torch' or 'auto' on CPU"
            )
    return impl


def token_logprobs_impl(impl: str):
    """The `[N, D]`, `[V, D]`, `[N]` log-prob function of a resolved `impl` ("triton" or "torch")."""
    if impl == "triton":
        from .logprobs.function import token_logprobs_triton

        return token_logprobs_triton
    from .logprobs.function import token_logprobs_chunked

    return token_logprobs_chunked


def policy_rows_impl(impl: str):
    """The per-token policy-loss function (row_loss, stats) of a resolved `impl` ("triton" or "torch")."""
    if impl == "triton":
        from .policy.function import policy_rows_triton

        return policy_rows_triton
    from .policy.naive import policy_rows_torch

    return policy_rows_torch
