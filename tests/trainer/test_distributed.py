"""Two gloo ranks, each with half of the batch, take the same optimizer step as one process with all of it."""

import os
import socket
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fastrl.losses import LossConfig
from fastrl.trainer import distributed as dist_utils
from fastrl.trainer.batching import Sample
from fastrl.trainer.metrics import read_metrics
from fastrl.trainer.tiny import tiny_model
from fastrl.trainer.update import train_step

AGGS = ("token-mean", "seq-mean-token-mean")


def batch(n=8):
    g = torch.Generator().manual_seed(5)
    out = []
    for i in range(n):
        p = torch.randint(3, 60, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        # uneven completion lengths: rank 0 gets more tokens than rank 1, so a per-rank mean would be wrong
        c = torch.randint(3, 60, (1 + i * (2 if i < n // 2 else 1),), generator=g).tolist()
        out.append(Sample([1] + p, c, float(torch.randn(1, generator=g))))
    return out


def one_step(samples, agg):
    model = tiny_model(64, hidden_size=32, num_layers=2, num_heads=4, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    m = train_step(model, opt, samples, LossConfig(loss_agg=agg), budget=24, packed=True, pad_id=0, max_grad_norm=0)
    return [p.detach().clone() for p in model.parameters()], m["loss"]


def _worker(rank, world, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        for agg in AGGS:
            params, loss = one_step(dist_utils.shard(batch()), agg)
            torch.save({"params": params, "loss": loss}, os.path.join(out_dir, f"{agg}-rank{rank}.pt"))
    except BaseException:
        dist.destroy_process_group()
        raise
    # meet, tear down, and exit 0 without the interpreter's finalizers, where a gloo thread can abort
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def test_two_gloo_ranks_take_the_single_process_step(tmp_path):
    mp.spawn(_worker, args=(2, str(tmp_path / "rdv"), str(tmp_path)), nprocs=2, join=True)
    for agg in AGGS:
        want, want_loss = one_step(batch(), agg)
        for rank in range(2):
            got = torch.load(tmp_path / f"{agg}-rank{rank}.pt")
            assert abs(got["loss"] - want_loss) < 1e-5, agg
            for a, b in zip(got["params"], want):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        # and the step moved the weights: the comparison is not between two untouched models
        start, _ = one_step([], agg)
        assert any((a - b).abs().max() > 1e-4 for a, b in zip(want, start))


def test_torchrun_two_ranks_end_to_end(tmp_path):
    """The real entry point under torchrun: ranks shard prompts, rank 0 logs every step once."""
    out = tmp_path / "run"
    with socket.socket() as sock:  # a free port, so parallel sessions do not collide
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", port,
           "-m", "fastrl.trainer", "train", "--preset", "tiny", "--output-dir", str(out), "--max-steps", "2",
           "--warmup-sft-steps", "5", "--prompts-per-step", "4", "--group-size", "4", "--save-steps", "1",
           "--no-progress"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(str(out))
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0.0 <= r["reward_correct_mean"] <= 1.0 for r in rows)
