"""Hard time limits for the math verifier: a pool of worker processes that are killed at the deadline.

Sympy cannot be interrupted from outside the thread that runs it, and ``signal.alarm`` works only on the main
thread (a trainer that scores rewards from a thread would silently lose every check), so each check runs in a
separate process and the parent kills it when its time is up, then starts a replacement in the background.

Workers are plain ``python -c`` subprocesses, not ``multiprocessing`` children: the parent may hold torch, CUDA
and threads, which makes ``fork`` unsafe, and ``spawn``/``forkserver`` would re-import the parent's main module
(and so torch: 1.5 s and 220 MB per worker). A worker imports only ``fastrl.rewards`` (torch-free) and the
verifier's sympy side (sympy + latex2sympy2_extended: about 0.5 s). Parent and worker talk over a
``multiprocessing.connection`` pipe: one ``(pred, gold, timeout)`` request, one ``bool`` reply.

Each worker runs in the python tool's sandbox (``fastrl.tools.sandbox``): no network, read-only files (writes
land in a private 16 MiB /tmp that goes with it), its own PID namespace, an unprivileged uid, the memory cap.

A worker also ends by itself when the parent dies: a thread watches the parent between checks, and during a
check a ``SIGALRM`` at timeout + 2 s (default action: terminate, which needs no GIL) backs up the parent's kill.
"""

from __future__ import annotations

import atexit
import math
import os
import subprocess
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import wait

from ..tools.sandbox import check_namespaces
from .extract import answer_of, extract_answer, gold_answer
from .normalize import quick_equal
from .worker import READY as _READY
from .worker import worker_command

__all__ = ["VerifierPool", "default_pool"]

# Longer inputs are extracted in a worker, under the time limit, rather than in the calling process (where a scan
# is linear but 1 MB of braces still takes ~0.5 s).
_INPROCESS_CHARS = 32_768
_EXTRACT_MODES = (None, "strict", "lenient")
# How long a fresh worker may take to import sympy before the pool gives up on it.
_STARTUP_TIMEOUT = 60.0


class _Worker:
    def __init__(self, memory_limit_mb: int, sandboxed: bool) -> None:
        import multiprocessing

        parent_conn, child_conn = multiprocessing.Pipe()
        fd = child_conn.fileno()
        command = worker_command(fd, memory_limit_mb, sandboxed)
        try:
            self.process = subprocess.Popen(
                command,
                pass_fds=(fd,),
                stdin=subprocess.DEVNULL,
                env={} if sandboxed else None,
                start_new_session=True,  # keeps terminal signals away; the parent owns the lifetime
            )
        except BaseException:
            parent_conn.close()
            raise
        finally:
            child_conn.close()
        self.conn = parent_conn
        self.ready = False

    def wait_ready(self, timeout: float) -> None:
        if self.ready:
            return
        if not self.conn.poll(timeout):
            raise RuntimeError(f"verifier worker did not start within {timeout:.0f} s")
        self.take_ready()

    def take_ready(self) -> None:
        message = self.conn.recv()
        if message != _READY:
            raise RuntimeError(f"verifier worker sent {message!r} instead of {_READY!r}")
        self.ready = True

    def kill(self) -> None:
        self.conn.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


_POOLS: weakref.WeakSet = weakref.WeakSet()


class VerifierPool:
    """Worker processes that check (pred, gold) answer pairs under a hard per-check time limit.

    Thread-safe: any thread may call ``math_equal`` or ``map``; each call borrows idle workers. A check that
    passes its deadline returns False, its worker is killed and a replacement starts in the background.
    Workers start lazily (or with ``start()``) and are killed by ``close()`` or at interpreter exit.

    Args:
        num_workers: processes to run at most (each about 60 MB and one CPU while busy).
        memory_limit_mb: address-space limit per worker; 0 for none.
        unsafe_without_namespaces: run the workers as plain processes (time and memory limits only) on a machine
            that refuses the sandbox's namespaces; without it such a machine raises SandboxUnavailableError.
    """

    def __init__(
        self, num_workers: int = 2, *, memory_limit_mb: int = 4096, unsafe_without_namespaces: bool = False
    ) -> None:
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
        if not isinstance(memory_limit_mb, int) or memory_limit_mb < 0:
            raise ValueError(f"memory_limit_mb must be an int >= 0, got {memory_limit_mb!r}")
        if not isinstance(unsafe_without_namespaces, bool):
            raise TypeError(f"unsafe_without_namespaces must be a bool, got {unsafe_without_namespaces!r}")
        self.num_workers = num_workers
        self.memory_limit_mb = memory_limit_mb
        self.unsafe_without_namespaces = unsafe_without_namespaces
        self._idle: deque[_Worker] = deque()
        self._count = 0  # workers alive: idle plus borrowed
        self._cond = threading.Condition()
        self._closed = False
        self._pid = os.getpid()
        _POOLS.add(self)

    def start(self) -> None:
        """Start every worker now and wait until they are ready (otherwise they start on first use)."""
        # Blocking for each slot also waits for a replacement that is still being spawned in the background.
        borrowed: list[_Worker] = []
        try:
            for _ in range(self.num_workers):
                borrowed.append(self._acquire(block=True))
            for worker in borrowed:
                worker.wait_ready(_STARTUP_TIMEOUT)
        finally:
            for worker in borrowed:
                self._release(worker)

    def _acquire(self, block: bool) -> _Worker | None:
        """Borrow an idle worker, or start a new one (not yet ready) while under ``num_workers``."""
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("VerifierPool is closed")
                if self._idle:
                    return self._pop_idle()
                if self._count < self.num_workers:
                    self._count += 1
                    break
                if not block:
                    return None
                self._cond.wait()
        try:
            return self._new_worker()
        except BaseException:
            self._forget()
            raise

    def _new_worker(self) -> _Worker:
        if not self.unsafe_without_namespaces:
            check_namespaces()
        return _Worker(self.memory_limit_mb, sandboxed=not self.unsafe_without_namespaces)

    def _pop_idle(self) -> _Worker:
        # Prefer a ready worker: a replacement that is still importing sympy would delay the check by ~0.5 s.
        for worker in reversed(self._idle):
            if worker.ready or worker.conn.poll(0):
                self._idle.remove(worker)
                if not worker.ready:
                    try:
                        worker.take_ready()
                    except (EOFError, OSError, RuntimeError):
                        worker.kill()
                        return self._new_worker()  # keeps its slot in the count
                return worker
        return self._idle.pop()

    def _forget(self) -> None:
        with self._cond:
            self._count -= 1
            self._cond.notify()

    def _release(self, worker: _Worker) -> None:
        with self._cond:
            if not self._closed:
                self._idle.append(worker)
                self._cond.notify()
                return
        worker.kill()

    def _replace(self, worker: _Worker) -> _Worker:
        """Kill a worker (timed out or crashed) and return a starting replacement, still borrowed."""
        worker.kill()
        try:
            return self._new_worker()
        except BaseException:
            self._forget()
            raise

    def _replace_in_background(self, worker: _Worker) -> None:
        """Kill a borrowed worker now; its replacement starts in a thread and joins the idle ones when spawned."""
        worker.kill()

        def spawn() -> None:
            try:
                replacement = self._new_worker()
            except BaseException:
                self._forget()
                return
            self._release(replacement)

        threading.Thread(target=spawn, daemon=True).start()

    def math_equal(self, pred: str | None, gold: str, *, timeout: float = 5.0) -> bool:
        """``math_equal`` on this pool; see ``fastrl.rewards.math_equal``."""
        return self.map([(pred, gold)], timeout=timeout)[0]

    def map(
        self, pairs: Sequence[tuple[str | None, str]], *, timeout: float = 5.0, extract: str | None = None
    ) -> list[bool]:
        """Check many (pred, gold) pairs in parallel; each check gets its own ``timeout`` seconds.

        A pred of None (no extracted answer) is False. Plain numbers are decided in this process; the rest go
        to the workers. The time limit counts from when the pair is handed to a worker: waiting for a free
        worker in a busy pool is not part of it.

        Args:
            pairs: (pred, gold) pairs; a gold may be a full solution (see ``gold_answer``).
            timeout: seconds each check may run once a worker has it.
            extract: None when each pred is an answer; "strict" or "lenient" when it is a completion to take the
                answer from (``extract_answer``). Inputs over 32 KB are extracted in the worker, under the limit.
        Returns:
            One bool per pair, in order; False for a pair whose check timed out or crashed its worker.
        """
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout):
            raise ValueError(f"timeout must be a finite number of seconds, got {timeout!r}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout!r}")
        if extract not in _EXTRACT_MODES:
            raise ValueError(f"extract must be one of {_EXTRACT_MODES}, got {extract!r}")
        results: list[bool] = [False] * len(pairs)
        # Completions of one prompt often give the same answer: each distinct (pred, gold) is checked once.
        undecided: dict[tuple, list[int]] = {}
        for i, pair in enumerate(pairs):
            pred, gold = _check_pair(pair)
            if pred is None:
                continue
            if len(pred) > _INPROCESS_CHARS or len(gold) > _INPROCESS_CHARS:
                undecided.setdefault((pred, gold, extract or "bare"), []).append(i)
                continue
            if extract is None:
                pred = answer_of(pred)
            else:
                pred = extract_answer(pred, lenient=extract == "lenient")
            gold = gold_answer(gold)
            if pred is None:
                continue
            decided = quick_equal(pred, gold)
            if decided is None:
                undecided.setdefault((pred, gold), []).append(i)
            else:
                results[i] = decided
        if undecided:
            tasks = list(undecided)
            for task, verdict in zip(tasks, self._run(tasks, float(timeout))):
                for i in undecided[task]:
                    results[i] = verdict
        return results

    def _run(self, tasks: list[tuple[str, str]], timeout: float) -> list[bool]:
        results = [False] * len(tasks)
        pending = deque(range(len(tasks)))
        workers = [self._acquire(block=True)]
        while len(workers) < len(pending) and (worker := self._acquire(block=False)) is not None:
            workers.append(worker)
        ready = [w for w in workers if w.ready]
        starting = [w for w in workers if not w.ready]
        busy: dict[_Worker, tuple[int, float]] = {}  # worker -> (pair index, deadline)
        startup_deadline = time.monotonic() + _STARTUP_TIMEOUT
        try:
            while pending or busy:
                while ready and pending:
                    worker, i = ready.pop(), pending.popleft()
                    deadline = time.monotonic() + timeout  # handing a long text over counts against the limit
                    try:
                        if worker.process.poll() is not None:  # bwrap is gone, its child may not be yet
                            raise BrokenPipeError
                        worker.conn.send((*tasks[i], timeout))
                    except OSError:  # it died while idle: the pair waits for the replacement
                        pending.appendleft(i)
                        starting.append(self._replace(worker))
                        continue
                    busy[worker] = (i, deadline)
                if not busy and not starting:
                    raise RuntimeError("every verifier worker failed to start")
                if not busy and time.monotonic() > startup_deadline:
                    raise RuntimeError(f"verifier workers did not start within {_STARTUP_TIMEOUT:.0f} s")
                next_deadline = min((d for _, d in busy.values()), default=startup_deadline)
                conns = [w.conn for w in busy] + [w.conn for w in starting]
                readable = set(wait(conns, timeout=max(0.0, next_deadline - time.monotonic())))
                if self._take_messages(readable, results, pending, ready, starting, busy):
                    startup_deadline = time.monotonic() + _STARTUP_TIMEOUT
        finally:
            for worker in busy:
                starting.append(self._replace(worker))  # interrupted mid-check: its reply would be stale
            for worker in ready + starting:
                self._release(worker)
        return results

    def _take_messages(self, readable, results, pending, ready, starting, busy) -> bool:
        """Act on the workers in `readable`: record replies, swap out the dead and the late (their pair is False),
        move started ones to `ready`. True when a replacement started for pairs still pending."""
        replaced = False
        for worker in list(busy):
            i, deadline = busy[worker]
            if worker.conn in readable:
                try:
                    results[i] = bool(worker.conn.recv())
                    del busy[worker]
                    ready.append(worker)
                    continue
                except (EOFError, OSError):
                    pass  # the worker died (out of memory, crashed): replace it
            elif time.monotonic() < deadline:
                continue
            del busy[worker]
            results[i] = False
            if pending:
                starting.append(self._replace(worker))
                replaced = True
            else:
                self._replace_in_background(worker)  # the call returns now, not after a fork
        for worker in [w for w in starting if w.conn in readable]:
            starting.remove(worker)
            try:
                worker.take_ready()
                ready.append(worker)
            except (EOFError, OSError, RuntimeError):
                worker.kill()  # a worker that cannot start is dropped, not restarted in a loop
                self._forget()
        return replaced

    def close(self) -> None:
        """Kill every worker; borrowed ones are killed when their call returns. Idempotent."""
        with self._cond:
            self._closed = True
            idle, self._idle = list(self._idle), deque()
            self._cond.notify_all()
        for worker in idle:
            worker.kill()

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_pair(pair) -> tuple[str | None, str]:
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TypeError(f"each pair must be a (pred, gold) tuple, got {pair!r:.80}")
    pred, gold = pair
    for name, value in (("pred", pred), ("gold", gold)):
        if not (value is None or isinstance(value, (str, int, float))) or isinstance(value, bool):
            raise TypeError(f"{name} must be a str (or a number), got {type(value).__name__}: {value!r:.80}")
    if gold is None:
        raise TypeError("gold must be a str (or a number), got None")
    return (None if pred is None else str(pred)), str(gold)


_default_pool: VerifierPool | None = None
_default_lock = threading.Lock()


def default_pool() -> VerifierPool:
    """The process-wide pool behind ``math_equal``: ``FASTRL_VERIFIER_WORKERS`` workers (default min(8, CPUs)).

    ``FASTRL_VERIFIER_UNSAFE_WITHOUT_NAMESPACES=1`` is its ``unsafe_without_namespaces``."""
    global _default_pool
    with _default_lock:
        # A forked child must not share its parent's workers (two readers on one pipe): it gets its own pool.
        if _default_pool is None or _default_pool._closed or _default_pool._pid != os.getpid():
            env = os.environ.get("FASTRL_VERIFIER_WORKERS")
            if env is not None and not env.isdigit():
                raise ValueError(f"FASTRL_VERIFIER_WORKERS must be a positive integer, got {env!r}")
            unsafe = os.environ.get("FASTRL_VERIFIER_UNSAFE_WITHOUT_NAMESPACES", "0")
            if unsafe not in ("0", "1"):
                raise ValueError(f"FASTRL_VERIFIER_UNSAFE_WITHOUT_NAMESPACES must be 0 or 1, got {unsafe!r}")
            workers = int(env) if env else max(1, min(8, os.cpu_count() or 1))
            _default_pool = VerifierPool(workers, unsafe_without_namespaces=unsafe == "1")
        return _default_pool


@atexit.register
def _close_all() -> None:
    for pool in list(_POOLS):
        pool.close()
