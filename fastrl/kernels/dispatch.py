"""Which implementation runs: `impl` ("auto", "triton", "torch") resolved to "triton" or "torch" for a device.

Each op maps the resolved name to its function in its own package (`logprobs.function.token_logprobs_impl`,
`policy.api.policy_rows_impl`), importing its Triton modules only when the Triton path is chosen: triton is an
optional dependency, and the torch paths must import and run without it. This module imports no op.
"""

import os

import torch

__all__ = ["IMPLS", "interpreter_on", "resolve_impl", "triton_available"]

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
