"""Run a function on P gloo ranks in spawned processes, with a bounded time."""

import datetime
import os

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
    finally:
        dist.destroy_process_group()


def spawn(fn, world: int, tmp_path, *args) -> None:
    """`fn(rank, world, *args)` on `world` ranks; raises if any rank fails."""
    init_file = os.path.join(str(tmp_path), f"rdv-{fn.__name__}-{world}")
    mp.spawn(_entry, args=(world, init_file, fn, args), nprocs=world, join=True)
