"""The verifier's workers (sympy's ``parse_expr`` is an ``eval``) run in the python tool's sandbox: another network,
PID and mount namespace, an unprivileged uid, the memory cap and a file-size cap; the opt-out keeps plain workers.
Read from outside, in /proc, while the pool holds a ready worker."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fastrl.rewards import VerifierPool
from fastrl.rewards import pool as pool_module
from fastrl.tools import SandboxUnavailableError
from fastrl.tools import sandbox as sandbox_module

pytestmark = pytest.mark.slow  # starts verifier workers


def _descendants(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children] + [d for c in children for d in _descendants(int(c))]


def _worker_process(pool: VerifierPool) -> int:
    """The interpreter that serves checks (not bwrap, whose argv holds the same words, nor the launcher)."""
    (worker,) = pool._idle
    for pid in [worker.process.pid, *_descendants(worker.process.pid)]:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if argv[1:2] == [b"-c"] and b"from fastrl.rewards.worker import serve" in argv[2]:
            return pid
    raise AssertionError("no worker interpreter found")


def _limit(pid: int, name: str) -> str:
    line = next(line for line in Path(f"/proc/{pid}/limits").read_text().splitlines() if line.startswith(name))
    return line[len(name) :].split()[0]


def test_workers_run_confined():
    with VerifierPool(1, memory_limit_mb=2048) as pool:
        pool.start()
        assert pool.math_equal("x^2-1", "(x-1)(x+1)") is True
        pid = _worker_process(pool)
        for ns in ("net", "pid", "mnt"):
            assert os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"), ns
        uid = int(
            next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if "Uid:" in line).split()[1]
        )
        assert uid >= sandbox_module._UID_BASE
        assert _limit(pid, "Max address space") == str(2048 << 20)
        assert _limit(pid, "Max file size") == str(sandbox_module._MAX_FILE_MB << 20)
        assert _limit(pid, "Max processes") == str(sandbox_module._MAX_PROCESSES)
        assert Path(f"/proc/{pid}/root/opt/fastrl/fastrl/rewards/worker.py").exists()
        assert not Path(f"/proc/{pid}/root/{os.getcwd()}").exists()  # the run's directory is not there


def test_pool_refuses_where_namespaces_fail_unless_told(tmp_path, monkeypatch):
    script = tmp_path / "bwrap"
    script.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    script.chmod(0o755)
    monkeypatch.setattr(sandbox_module, "_bwrap", lambda: str(script))
    monkeypatch.setattr(sandbox_module, "_probed", {})
    with VerifierPool(1) as pool, pytest.raises(SandboxUnavailableError, match="uid map: Permission denied"):
        pool.math_equal("x^2-1", "(x-1)(x+1)")
    with VerifierPool(1, unsafe_without_namespaces=True) as pool:
        assert pool.math_equal("x^2-1", "(x-1)(x+1)") is True
        assert os.readlink(f"/proc/{_worker_process(pool)}/ns/net") == os.readlink("/proc/self/ns/net")


def test_default_pool_reads_the_opt_out(monkeypatch):
    monkeypatch.setattr(pool_module, "_default_pool", None)
    monkeypatch.setenv("FASTRL_VERIFIER_UNSAFE_WITHOUT_NAMESPACES", "yes")
    with pytest.raises(ValueError, match="must be 0 or 1, got 'yes'"):
        pool_module.default_pool()


def test_a_replacement_started_from_a_passing_thread_stays_alive():
    # A timed-out worker's replacement starts in a short-lived thread; it must outlive that thread.
    with VerifierPool(1) as pool:
        pool.start()
        assert pool.math_equal("(5 \\cdot 10^7)!", "5 \\cdot 10^7 \\cdot (5 \\cdot 10^7-1)!", timeout=0.5) is False
        pool.start()  # waits for the replacement to be ready, after its thread has ended
        time.sleep(0.5)
        (worker,) = pool._idle
        assert worker.process.poll() is None, f"the replacement died: {worker.process.returncode}"
        assert pool.math_equal("x^2-1", "(x-1)(x+1)") is True
