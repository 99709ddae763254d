"""One rank of the sharded-checkpoint kill test (run by test_sharded_checkpoint.py with RANK etc. set).

save OUT KILL_RANK   step, save checkpoint 1, step, then save checkpoint 2; rank KILL_RANK SIGKILLs
                     itself right after writing its shard file of checkpoint 2 (before the metadata)
resume OUT           load the latest checkpoint, check it is checkpoint 1, then save checkpoint 2
"""

import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from fastrl.trainer.checkpoint import latest_checkpoint
from fastrl.trainer.fsdp import run_sharded, shard_model
from fastrl.trainer.sharded_checkpoint import load_sharded, save_sharded
from fastrl.trainer.tiny import tiny_model


def build():
    model = shard_model(tiny_model(64, hidden_size=32, num_layers=2, num_heads=4, seed=0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (s + 1))
    return model, opt, sched


def step(model, opt, sched):
    ids = torch.randint(3, 64, (2, 6))  # each rank's RNG stream: restored by a resume
    run_sharded(model, lambda m, x: m(input_ids=x).logits.float().logsumexp(-1).mean(), ids).backward()
    opt.step()
    opt.zero_grad()
    sched.step()


def full(model):
    return {n: p.full_tensor() for n, p in model.named_parameters()}


def main(mode, out, kill_rank=-1):
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model, opt, sched = build()
    if mode == "save":
        step(model, opt, sched)
        save_sharded(out, 1, model, opt, sched, {"data_position": 11})
        torch.save({"params": full(model), "next": torch.rand(3)}, os.path.join(out, f"saved-rank{rank}.pt"))
        step(model, opt, sched)
        if rank == kill_rank:
            write = dcp.FileSystemWriter.write_data

            def write_then_die(self, plan, planner):
                fut = write(self, plan, planner)
                fut.wait()
                os.kill(os.getpid(), signal.SIGKILL)

            dcp.FileSystemWriter.write_data = write_then_die
        save_sharded(out, 2, model, opt, sched, {"data_position": 22})
        raise SystemExit("checkpoint 2 completed: the kill did not happen")
    state = load_sharded(latest_checkpoint(out), model, opt, sched)
    saved = torch.load(os.path.join(out, f"saved-rank{rank}.pt"))
    assert state["step"] == 1 and state["data_position"] == 11, state
    for name, p in full(model).items():
        assert torch.equal(p, saved["params"][name]), name
    assert torch.equal(torch.rand(3), saved["next"])  # this rank's RNG stream continues where it was saved
    assert sched.last_epoch == 1
    step(model, opt, sched)
    save_sharded(out, 2, model, opt, sched, {"data_position": 22})
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *[int(a) for a in sys.argv[3:]])
