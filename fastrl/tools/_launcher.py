"""The first Python that runs inside the sandbox: it finishes the confinement, then runs the payload.

``bubblewrap`` has already built the namespaces and the read-only file tree. This program, still privileged inside
them, mounts the size- and inode-capped ``/tmp``, sets the resource limits, gives up its privileges for good (root
drops to an unprivileged uid of its own: ``RLIMIT_NPROC`` is not enforced for uid 0), and then either runs model
code read from stdin (``"code"``) or executes a command (``"exec"``). It travels as source text (``python -I -c``)
so the sandbox needs no view of the fastrl package. Its one argument is the JSON object that
``sandbox.sandboxed_command`` builds.
"""

import ctypes
import json
import os
import resource
import sys

_MS_NOSUID, _MS_NODEV = 2, 4
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4


def _main(config: dict) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if config["tmpfs"]:
        if libc.mount(b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV, config["tmpfs"].encode()) != 0:
            raise OSError(ctypes.get_errno(), "mounting the sandbox's /tmp failed")
    for name, value in config["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    uid = config["uid"]
    if uid is None:
        pass  # the opt-out without namespaces: the caller's uid, whose files this process must reach
    elif os.getuid() == 0:
        # Changing every uid away from 0 clears the permitted, effective and ambient capabilities.
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    elif libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        # Not root (a user namespace): without ambient capabilities the next execve drops them all.
        raise OSError(ctypes.get_errno(), "clearing the ambient capabilities failed")
    if uid is not None and 0 in os.getresuid():
        raise RuntimeError("the sandbox launcher is still uid 0 after dropping privileges")
    os.chdir(config["cwd"])
    if config["mode"] == "exec":
        os.execve(config["argv"][0], config["argv"], {})
    code = sys.stdin.buffer.read().decode("utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    # Re-execute so the model's code gets a fresh interpreter without this program's modules.
    os.execve(sys.executable, [sys.executable, "-I", "-c", code], {})


_main(json.loads(sys.argv[1]))
