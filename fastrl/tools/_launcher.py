"""The first Python that runs inside the sandbox: it finishes the confinement, then runs the payload.

``bubblewrap`` has already built the namespaces and the read-only file tree. This program, still privileged inside
them, mounts the size- and inode-capped ``/tmp`` and ``/dev/shm``, sets the resource limits, gives up its
privileges for good (root drops to an unprivileged uid of its own: ``RLIMIT_NPROC`` is not enforced for uid 0),
and then either runs model code read from stdin (``"code"``: in this process, once unprivileged, as ``python -c``
would) or executes a command (``"exec"``). It travels as source text (``python -I -c``), so the sandbox needs no
view of the fastrl package. Its one argument is the JSON object that ``sandbox.sandboxed_command`` builds.
"""

import ctypes
import json
import os
import resource
import sys

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC = 1, 2, 4, 32, 4096, 16384
_CAPABILITY_VERSION_3 = 0x20080522
_PR_CAPBSET_DROP = 24


def _capabilities() -> dict[str, int]:
    status = open("/proc/self/status").read().splitlines()
    fields = dict(
        line.split(":\t", 1) for line in status if line.startswith(("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"))
    )
    return {name: int(value, 16) for name, value in fields.items()}


def _drop_privileges(libc, uid: int | None) -> None:
    """Give up, for good, what bwrap granted for the steps above; ``uid``: the uid root switches to (None: keep)."""
    for capability in range(64):  # the bounding set first, so that no later execve can regain anything
        libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0)  # EINVAL past the kernel's last capability
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    if libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:
        raise OSError(ctypes.get_errno(), "dropping the capabilities failed")
    if (uid is not None and 0 in os.getresuid()) or any(_capabilities().values()):
        raise RuntimeError(f"the sandbox launcher kept privileges: uids {os.getresuid()}, {_capabilities()}")


def _main(config: dict) -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    for target in (b"/tmp", b"/dev/shm") if config["tmpfs"] else ():  # /dev/shm: multiprocessing's locks
        if libc.mount(b"tmpfs", target, b"tmpfs", _MS_NOSUID | _MS_NODEV, config["tmpfs"].encode()) != 0:
            raise OSError(ctypes.get_errno(), f"mounting the sandbox's {target.decode()} failed")
    for kept, target in config.get("rebind", ()):  # a Python installation under /tmp: back, read-only
        os.makedirs(target, mode=0o755, exist_ok=True)
        if libc.mount(kept.encode(), target.encode(), None, _MS_BIND | _MS_REC, None) != 0:
            raise OSError(ctypes.get_errno(), f"binding {target} into the sandbox's /tmp failed")
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
        if libc.mount(None, target.encode(), None, flags, None) != 0:
            raise OSError(ctypes.get_errno(), f"making {target} read-only failed")
    for name, value in config["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    if config["drop_privileges"]:
        _drop_privileges(libc, config["uid"])
    os.chdir(config["cwd"])
    if config["mode"] == "exec":
        os.execve(config["argv"][0], config["argv"], {})
    code = sys.stdin.buffer.read().decode("utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return code


def _run_as_main(code: str) -> None:
    """Run the model's code as ``python -c`` would, in this (now unprivileged) process: one interpreter start."""
    import traceback
    import types

    os.environ.clear()
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
    except SystemExit:
        raise
    except BaseException as error:
        # The traceback starts at the model's code: this program's frames are not its business.
        traceback.print_exception(type(error), error, error.__traceback__.tb_next)
        sys.exit(1)


_code = _main(json.loads(sys.argv[1]))
del _main
_run_as_main(_code)
