"""How the rollout process sets itself up before its engine starts: it dies with the trainer, and it may be pinned
to CPU cores of its own (a bench setting)."""

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (Linux prctl); exit now if the parent is already gone."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)


def pin_cpus(cores: str) -> None:
    """`FASTRL_ROLLOUT_CPUS` (a bench setting, e.g. "1" or "2,3"): run this process on those cores with one torch
    thread per core, set before the engine starts its threads; "" leaves both as inherited."""
    if not cores:
        return
    try:
        ids = {int(c) for c in cores.split(",")}
    except ValueError:
        raise ValueError(f"FASTRL_ROLLOUT_CPUS={cores!r}: expected comma-separated core ids ('1', '2,3')") from None
    import torch

    os.sched_setaffinity(0, ids)
    torch.set_num_threads(len(ids))
