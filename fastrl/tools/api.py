"""The python tool's entry point and the interface every sandbox implements."""

from __future__ import annotations

import threading
from typing import Protocol, runtime_checkable

from .sandbox import LocalSandbox, ToolResult

__all__ = ["Sandbox", "run_python"]


@runtime_checkable
class Sandbox(Protocol):
    """Anything that runs Python code somewhere other than the calling process and reports what it printed."""

    def run(self, code: str, *, timeout_s: float = 10.0, memory_mb: int = 1024) -> ToolResult: ...


_default: LocalSandbox | None = None
_default_lock = threading.Lock()


def _default_sandbox() -> LocalSandbox:
    global _default
    with _default_lock:
        if _default is None:
            _default = LocalSandbox()
        return _default


def run_python(
    code: str,
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    sandbox: Sandbox | None = None,
    unsafe_without_namespaces: bool = False,
) -> ToolResult:
    """Run model-written Python code in a sandbox and return what it printed.

    Each call is a fresh interpreter: no network, its own PID namespace and /proc, a private 16 MiB /tmp, no view
    of $HOME or the run's directories, read-only system files, an empty environment and stdin, an unprivileged uid,
    and limits on CPU time, address space, file size, open files and processes. The wall-clock timeout kills the
    whole process tree.

    Args:
        code: the program, as ``python -c`` would take it (at most 100,000 bytes).
        timeout_s: wall-clock seconds (the CPU-time limit is the same, rounded up).
        memory_mb: address-space limit in MiB.
        sandbox: where to run it; default: a process-wide ``LocalSandbox`` (as many at once as there are CPUs).
        unsafe_without_namespaces: on a machine that refuses namespaces, run with rlimits only (see
            ``LocalSandbox``); only with the default sandbox.
    Returns:
        ToolResult(output, status): status "ok", "error" or "timeout".
    Raises:
        SandboxUnavailableError: the machine refuses namespaces and the opt-out was not given.
    """
    if not isinstance(unsafe_without_namespaces, bool):
        raise TypeError(f"unsafe_without_namespaces must be a bool, got {unsafe_without_namespaces!r}")
    if sandbox is None:
        sandbox = LocalSandbox(unsafe_without_namespaces=True) if unsafe_without_namespaces else _default_sandbox()
    elif unsafe_without_namespaces:
        raise ValueError("unsafe_without_namespaces applies to the default sandbox; configure the one you passed")
    elif not isinstance(sandbox, Sandbox):
        raise TypeError(f"sandbox must have a run(code, *, timeout_s, memory_mb) method, got {sandbox!r}")
    return sandbox.run(code, timeout_s=timeout_s, memory_mb=memory_mb)
