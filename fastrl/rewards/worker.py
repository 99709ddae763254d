"""The verifier worker: a process that answers (pred, gold) checks for the pool (``pool``) until told to stop.

It imports only ``fastrl.rewards`` (torch-free) and the sympy side (``verify``); the pool kills it at a check's
deadline, and it ends by itself when the parent dies. ``worker_command`` is its command line, confined by the
python tool's sandbox: no network, no writes outside a private /tmp, its own PID namespace, an unprivileged uid.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

from .extract import answer_of, extract_answer, gold_answer

__all__ = ["READY", "serve", "worker_command"]

READY = "ready"
# The directory holding the ``fastrl`` package this module belongs to: the worker imports the same copy, which a
# sandboxed worker sees read-only at _SANDBOX_ROOT.
_ROOT = Path(__file__).resolve().parents[2]
_SANDBOX_ROOT = "/opt/fastrl"
_BOOTSTRAP = (
    "import sys\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "from fastrl.rewards.worker import serve\n"
    "serve(int(sys.argv[2]), int(sys.argv[3]))\n"
)


def worker_command(fd: int, memory_limit_mb: int, sandboxed: bool) -> list[str]:
    """The argv of a worker that talks over inherited ``fd``; sandboxed unless the pool's opt-out says not."""
    if not sandboxed:
        return [sys.executable, "-c", _BOOTSTRAP, str(_ROOT), str(fd), str(memory_limit_mb)]
    from ..tools.sandbox import sandboxed_command

    command = [sys.executable, "-c", _BOOTSTRAP, _SANDBOX_ROOT, str(fd), str(memory_limit_mb)]
    binds = ((str(_ROOT / "fastrl"), f"{_SANDBOX_ROOT}/fastrl"),)
    # Replacements start from a passing thread: bwrap's die-with-parent would kill them when it ends.
    limit = memory_limit_mb or None
    return sandboxed_command(command, memory_mb=limit, cpu_s=None, binds=binds, die_with_parent=False)


def serve(fd: int, memory_limit_mb: int) -> None:
    """Worker main loop: answer (pred, gold) requests until the parent closes the pipe or dies."""
    import resource
    import signal
    import warnings

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it kills us on exit
    warnings.simplefilter("ignore")  # sympy deprecation chatter would land in the trainer's log
    if memory_limit_mb > 0:
        # A runaway expansion raises MemoryError here instead of pushing the host into swap.
        limit = memory_limit_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    parent = os.getppid()

    def _orphan_watch() -> None:
        # A daemon thread gets the GIL between bytecodes even while sympy computes in Python.
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=_orphan_watch, daemon=True).start()
    from .verify import is_equiv

    conn = Connection(fd)
    try:
        conn.send(READY)
    except OSError:
        return  # the parent is gone (or gave up on us) before we were ready
    while True:
        try:
            *task, timeout = conn.recv()
        except (EOFError, OSError):
            return
        # The parent kills us at the deadline. If it is gone, the orphan watch cannot run while sympy sits in one
        # long C call (math.factorial holds the GIL), but SIGALRM's default action ends the process regardless.
        signal.alarm(min(math.ceil(timeout) + 2, 2**31 - 1))
        try:
            result = _check_in_worker(*task, is_equiv=is_equiv)
        except BaseException:  # MemoryError, RecursionError: the answer is "not verified", the worker lives on
            result = False
        signal.alarm(0)
        try:
            conn.send(result)
        except OSError:
            return  # the parent gave up on this check and closed the pipe


def _check_in_worker(text: str, gold: str, extract: str | None = None, is_equiv=None) -> bool:
    # (pred, gold): an answer already extracted; (text, gold, mode): extract here, under the time limit.
    if extract is not None:
        text = answer_of(text) if extract == "bare" else extract_answer(text, lenient=extract == "lenient")
        gold = gold_answer(gold)
    return text is not None and bool(is_equiv(text, gold))
