"""Two gloo ranks, each with half of the batch, take the same optimizer step as one process with all of it."""

import os

import pytest
import torch
from _batches import uneven_batch
from _spawn import spawn

from fastrl.losses import LossConfig
from fastrl.trainer import distributed as dist_utils
from fastrl.trainer.tiny import tiny_model
from fastrl.trainer.update import StepSettings, train_step

AGGS = ("token-mean", "seq-mean-token-mean")


def one_step(samples, agg):
    model = tiny_model(64, hidden_size=32, num_layers=2, num_heads=4, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    m = train_step(model, opt, samples, StepSettings(LossConfig(loss_agg=agg), 24, True, 0, max_grad_norm=0))
    return [p.detach().clone() for p in model.parameters()], m["loss"]


def _worker(rank, world, out_dir):
    # small buckets: the embedding's 8 KiB gradient is all-reduced in place, the norms' together in one buffer
    dist_utils.BUCKET_BYTES = 4096
    for agg in AGGS:
        params, loss = one_step(dist_utils.shard(uneven_batch()), agg)
        torch.save({"params": params, "loss": loss}, os.path.join(out_dir, f"{agg}-rank{rank}.pt"))


@pytest.mark.slow
def test_two_gloo_ranks_take_the_single_process_step(tmp_path):
    spawn(_worker, 2, tmp_path, str(tmp_path))
    for agg in AGGS:
        want, want_loss = one_step(uneven_batch(), agg)
        for rank in range(2):
            got = torch.load(tmp_path / f"{agg}-rank{rank}.pt")
            assert abs(got["loss"] - want_loss) < 1e-5, agg
            for a, b in zip(got["params"], want):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        # and the step moved the weights: the comparison is not between two untouched models
        start, _ = one_step([], agg)
        assert any((a - b).abs().max() > 1e-4 for a, b in zip(want, start))
