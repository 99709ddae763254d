"""The verifier worker: a process that answers (pred, gold) checks for the pool (``pool``) until told to stop.

It imports only ``fastrl.rewards`` (torch-free) and the sympy side (``verify``); the pool kills it at a check's
deadline, and it ends by itself when the parent dies.
"""

from __future__ import annotations

import math
import os
import threading
import time
from multiprocessing.connection import Connection

from .extract import answer_of, extract_answer, gold_answer

__all__ = ["READY", "serve"]

READY = "ready"


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
