"""FSDP2 on 2 gloo ranks: 3 AdamW steps (clipped) equal the 1-process run, at half the state bytes per rank.

Each rank gets half of the batch (uneven lengths: the ranks plan different micro-batch counts, so the
filler passes are exercised); the sharded parameters are gathered and compared with the single-process
run's in float32. The bytes each rank holds of parameters, gradients and AdamW moments are measured
(local shards) just before the last step's zero_grad and compared with the replicated run's.
"""

import pytest
import torch
from _batches import uneven_batch
from _spawn import spawn

from fastrl.losses import LossConfig
from fastrl.trainer import distributed as dist_utils
from fastrl.trainer.batching import plan_microbatches
from fastrl.trainer.fsdp import shard_model, state_bytes
from fastrl.trainer.tiny import tiny_model
from fastrl.trainer.update import StepSettings, sequence_logprobs, train_step

BUDGET = 24
CONFIG = LossConfig(loss_agg="token-mean", eps_high=0.28)
CLIP = 0.5


class MeasuredAdamW(torch.optim.AdamW):
    """AdamW that records the state bytes when the step's gradients are cleared (their peak)."""

    def zero_grad(self, set_to_none=True):
        self.measured = state_bytes(self.model, self)
        super().zero_grad(set_to_none=set_to_none)


def three_steps(model, samples):
    opt = MeasuredAdamW(model.parameters(), lr=1e-3)
    opt.model = model
    losses = []
    for _ in range(3):
        m = train_step(model, opt, samples, StepSettings(CONFIG, BUDGET, True, 0, max_grad_norm=CLIP))
        losses.append((m["loss"], m["grad_norm"]))
    logp = sequence_logprobs(model, samples, StepSettings(LossConfig(), BUDGET, True, 0))
    return opt.measured, losses, logp


def model():
    return tiny_model(64, hidden_size=32, num_layers=2, num_heads=4, seed=0)


def _worker(rank, world, out_dir):
    sharded = shard_model(model())
    samples = dist_utils.shard(uneven_batch())
    measured, losses, logp = three_steps(sharded, samples)
    params = {n: p.full_tensor() for n, p in sharded.named_parameters()}
    plan = len(plan_microbatches([len(s) for s in samples], BUDGET, True))
    torch.save(dict(params=params, bytes=measured, losses=losses, logp=logp, plan=plan), f"{out_dir}/rank{rank}.pt")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fsdp_steps_equal_single_process_with_half_the_bytes(tmp_path):
    spawn(_worker, 2, tmp_path, str(tmp_path))
    torch.set_num_threads(1)
    ref = model()
    start = {n: p.detach().clone() for n, p in ref.named_parameters()}
    measured, losses, logp = three_steps(ref, uneven_batch())
    replicated = sum(measured.values())
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert got[0]["plan"] != got[1]["plan"]  # unequal micro-batch counts: filler passes ran
    for r, g in enumerate(got):
        for name, p in ref.named_parameters():
            torch.testing.assert_close(
                g["params"][name], p.detach(), rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}"
            )
        torch.testing.assert_close(torch.tensor(g["losses"]), torch.tensor(losses), rtol=1e-5, atol=1e-7)
        mine = list(range(4)) if r == 0 else list(range(4, 8))
        for i, lp in zip(mine, g["logp"]):
            torch.testing.assert_close(torch.tensor(lp), torch.tensor(logp[i]), rtol=1e-5, atol=1e-6)
        ratio = sum(g["bytes"].values()) / replicated
        assert g["bytes"]["grads"] > 0 and g["bytes"]["optimizer"] > 0
        print(f"rank {r}: {sum(g['bytes'].values())} of {replicated} bytes = {ratio:.3f}")
        assert ratio <= 0.6, (g["bytes"], measured)
    assert any((start[n] - p).abs().max() > 1e-4 for n, p in ref.named_parameters())  # the steps moved the weights
    assert max(norm for _, norm in losses) > CLIP  # clipping bound: the global norm of the shards was used
