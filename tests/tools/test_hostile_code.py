"""Hostile model code in the python tool's sandbox: each returns an observation within its limit, this process lives
on, nothing is left running and nothing outside the sandbox changes.

Every test here starts sandboxes (a bwrap and one or two interpreters each), so the file is ``slow``; one
``LocalSandbox`` is shared. The fixtures plant what the code goes after: a secret in this process's environment, a
world-readable file and world-writable directories outside the sandbox, a TCP listener and Unix sockets.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fastrl.tools import LocalSandbox, ToolResult
from fastrl.tools import sandbox as sandbox_module

pytestmark = pytest.mark.slow

_SECRET = "fastrl-sandbox-secret-4f1c"


@pytest.fixture(scope="module")
def box() -> LocalSandbox:
    return LocalSandbox(max_concurrency=4)


@pytest.fixture
def outside():
    """World-writable directories and a world-readable file outside the sandbox, as a shared run might have."""
    root = Path(tempfile.mkdtemp(prefix="fastrl-outside-", dir="/tmp"))
    os.chmod(root, 0o777)
    for name in ("home", "out"):
        (root / name).mkdir()
        os.chmod(root / name, 0o777)
    secret = root / "secret.txt"
    secret.write_text(_SECRET)
    os.chmod(secret, 0o644)
    yield root
    for path in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        path.unlink() if not path.is_dir() or path.is_symlink() else path.rmdir()
    root.rmdir()


_USED_UIDS: set[int] = set()


@pytest.fixture(autouse=True)
def _record_uids(monkeypatch):
    """Note the uid each sandbox drops to (a verifier pool alive in this process has sandboxes of its own)."""
    build = sandbox_module.sandboxed_command

    def recording(*args, **kwargs):
        command = build(*args, **kwargs)
        _USED_UIDS.add(json.loads(command[-1])["uid"])
        return command

    monkeypatch.setattr(sandbox_module, "sandboxed_command", recording)


def _sandbox_processes() -> list[int]:
    """Processes still alive on the host under a uid that one of this file's sandboxes dropped to."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
            if int(uid_line.split()[1]) in _USED_UIDS:
                pids.append(int(entry))
    return pids


def _run(box: LocalSandbox, code: str, *, timeout_s: float = 5.0, memory_mb: int = 512, limit_s: float) -> ToolResult:
    start = time.monotonic()
    result = box.run(code, timeout_s=timeout_s, memory_mb=memory_mb)
    elapsed = time.monotonic() - start
    assert elapsed < limit_s, f"the call took {elapsed:.1f} s (limit {limit_s} s): {result}"
    # The call returns once the namespace's init is gone, and the kernel has then killed everything in it; under a
    # heavy load the host's /proc can still list one of them for a moment, so look again for up to 2 s. A process
    # that really outlives the call (a daemon without the PID namespace) sleeps 60 s and still fails this.
    left = _sandbox_processes()
    for _ in range(20):
        if not left:
            break
        time.sleep(0.1)
        left = _sandbox_processes()
    assert left == [], "sandbox processes outlived the call"
    return result


def test_infinite_loop_times_out(box):
    result = _run(box, "while True:\n    pass", timeout_s=1.0, limit_s=4.0)
    assert result.status == "timeout", result


def test_fork_bomb_is_capped_by_the_process_limit(box):
    # Bounded at 400 forks so that a sandbox without the limit cannot take the machine down while it fails.
    code = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(400):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        continue\n"
        "    if pid == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        "print('forked', n)\n"
    )
    result = _run(box, code, limit_s=8.0)
    assert result.status == "ok", result
    forked = int(result.output.split()[1])
    assert 0 < forked < 32, result  # RLIMIT_NPROC: 32 processes


def test_code_runs_unprivileged(box):
    code = (
        "import os\n"
        "sets = ('CapInh', 'CapPrm', 'CapEff', 'CapBnd')\n"
        "caps = [line for line in open('/proc/self/status') if line.startswith(sets)]\n"
        "print(0 in os.getresuid(), [int(line.split()[1], 16) for line in caps])\n"
    )
    result = _run(box, code, limit_s=4.0)
    assert result == ToolResult("False [0, 0, 0, 0]\n", "ok")


def test_memory_bomb_fails_in_the_sandbox(box):
    code = "b = bytearray(768 << 20)\nprint('allocated', len(b))"
    result = _run(box, code, memory_mb=256, limit_s=4.0)
    assert result.status == "error" and "MemoryError" in result.output, result


def test_100_mb_print_is_cut_and_killed(box):
    result = _run(box, "import sys\nsys.stdout.write('x' * (100 << 20))", memory_mb=1024, limit_s=6.0)
    assert result.status == "error", result.output[-200:]
    assert len(result.output) < 40_000 and "more bytes not shown" in result.output and "killed" in result.output


def test_many_files_in_tmp_hit_the_inode_cap(box):
    code = (
        "n = 0\n"
        "try:\n"
        "    for n in range(20000):\n"
        "        open(f'/tmp/f{n}', 'w').close()\n"
        "except OSError as e:\n"
        "    print('stopped', n, e.errno)\n"
        "else:\n"
        "    print('stopped', n + 1, 0)\n"
    )
    result = _run(box, code, limit_s=6.0)
    assert result.status == "ok", result
    assert int(result.output.split()[1]) <= 1024, result  # the private /tmp's inode cap


def test_writes_outside_change_nothing(box, outside):
    # The run's output directory, a world-writable $HOME, the real $HOME, and /tmp (the sandbox's own).
    refused = [outside / "out" / "written", outside / "home" / "written", Path.home() / "fastrl-written"]
    private = Path("/tmp") / f"fastrl-written-{os.getpid()}"
    code = "\n".join(
        f"try:\n    open({str(t)!r}, 'w').write('x')\n    print('wrote', {str(t)!r})\nexcept OSError as e:\n"
        f"    print('refused', e.errno)"
        for t in [*refused, private]
    )
    before = sorted(p.name for p in outside.rglob("*"))
    try:
        result = _run(box, code, limit_s=4.0)
    finally:
        created = refused[2].exists()
        refused[2].unlink(missing_ok=True)  # a failing sandbox must not leave litter in the real $HOME
    assert not created
    assert result.output.splitlines() == ["refused 2", "refused 2", "refused 13", f"wrote {private}"], result
    assert sorted(p.name for p in outside.rglob("*")) == before
    assert not any(t.exists() for t in [*refused, private])


def test_environment_planted_file_and_our_environ_are_invisible(box, outside, monkeypatch):
    monkeypatch.setenv("FASTRL_SANDBOX_SECRET", _SECRET)
    code = (
        "import os\n"
        "print(sorted(os.environ))\n"
        f"print(os.environ.get('FASTRL_SANDBOX_SECRET'))\n"
        f"print(os.path.exists({str(outside / 'secret.txt')!r}))\n"
        f"print(os.path.exists('/proc/{os.getpid()}'))\n"
        f"try:\n    print(open('/proc/{os.getpid()}/environ', 'rb').read())\nexcept OSError as e:\n    print(e.errno)\n"
    )
    result = _run(box, code, limit_s=4.0)
    assert result.status == "ok", result
    lines = result.output.splitlines()
    assert lines[1:4] == ["None", "False", "False"], result.output
    assert _SECRET not in result.output


def test_network_and_sockets_are_unreachable(box, outside):
    with socket.socket() as listener, socket.socket(socket.AF_UNIX) as unix, socket.socket(socket.AF_UNIX) as abstract:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        unix_path = outside / "tool.sock"
        unix.bind(str(unix_path))
        os.chmod(unix_path, stat.S_IRWXU | stat.S_IRWXG | stat.S_IRWXO)
        unix.listen()
        abstract.bind(b"\0fastrl-sandbox-test")
        abstract.listen()
        port = listener.getsockname()[1]
        code = (
            "import socket\n"
            f"for family, address in [(socket.AF_INET, ('127.0.0.1', {port})), (socket.AF_UNIX, {str(unix_path)!r}),"
            " (socket.AF_UNIX, b'\\0fastrl-sandbox-test')]:\n"
            "    s = socket.socket(family)\n"
            "    s.settimeout(2)\n"
            "    try:\n"
            "        s.connect(address)\n"
            "        print('connected')\n"
            "    except OSError as e:\n"
            "        print('refused', e.errno)\n"
        )
        result = _run(box, code, limit_s=4.0)
    assert result.status == "ok", result
    assert result.output.count("refused") == 3 and "connected" not in result.output, result.output


def test_killing_the_callers_pid_has_no_effect(box):
    code = f"import os\ntry:\n    os.kill({os.getpid()}, 9)\nexcept ProcessLookupError:\n    print('no such process')"
    result = _run(box, code, limit_s=4.0)
    assert result.output.strip() == "no such process", result


def test_child_and_setsid_daemon_are_killed_when_the_code_exits(box):
    code = (
        "import os, subprocess, time\n"
        "subprocess.Popen(['/bin/sleep', '60'])\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(0.2)\n"
        "print('left them running')\n"
    )
    result = _run(box, code, limit_s=4.0)
    assert result.status == "ok" and "left them running" in result.output, result


def test_reading_stdin_sees_end_of_file(box):
    result = _run(box, "import sys\nprint(repr(sys.stdin.read()))", limit_s=4.0)
    assert result.status == "ok" and result.output.strip() == "''", result


def test_64_concurrent_calls_run_at_most_max_concurrency_at_once(box, monkeypatch):
    live, peak, lock = [0], [0], threading.Lock()
    run_once = sandbox_module._run_once

    def counted(*args, **kwargs):
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        try:
            return run_once(*args, **kwargs)
        finally:
            with lock:
                live[0] -= 1

    monkeypatch.setattr(sandbox_module, "_run_once", counted)
    start = time.monotonic()
    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(lambda i: box.run(f"print({i} * {i})", timeout_s=20.0), range(64)))
    assert time.monotonic() - start < 40
    assert [r.output for r in results] == [f"{i * i}\n" for i in range(64)]
    assert all(r.status == "ok" for r in results)
    assert peak[0] == box.max_concurrency
    assert _sandbox_processes() == []
