"""Run a function on P gloo ranks in spawned processes, with a bounded time."""

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT_S = 120  # a rank stuck in a collective fails after this instead of hanging the suite


def _entry(rank, world, init_file, fn, args):
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
    )
    torch.set_num_threads(1)
    try:
        fn(rank, world, *args)
    except BaseException:
        dist.destroy_process_group()
        raise  # mp.spawn hands this rank's traceback to the test process
    leave(rank)


def leave(rank: int) -> None:
    """End a rank whose work succeeded with exit code 0.

    All ranks meet before any tears its group down, and the process then exits without running the
    interpreter's finalizers: a gloo worker thread still alive there can abort the process (SIGABRT,
    "terminate called without an active exception") after every result was already written.
    """
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(fn, world: int, tmp_path, *args) -> None:
    """`fn(rank, world, *args)` on `world` ranks; raises if any rank fails."""
    init_file = os.path.join(str(tmp_path), f"rdv-{fn.__name__}-{world}")
    mp.spawn(_entry, args=(world, init_file, fn, args), nprocs=world, join=True)
