"""Data parallel 2 × sequence parallel 2 on 4 gloo ranks takes the data-parallel step without sequence parallelism.

Ranks 0-1 split replica 0's sequences, ranks 2-3 replica 1's; each replica holds its half of one global batch
whose halves have unequal token counts (so a normalizer or a gradient summed over the wrong ranks shows). One
launch takes a step of a Qwen2 model (GQA, q/k/v biases, an untied head) replicated and under FSDP2, packed
micro-batches of 40 tokens; its step-1 loss, entropy and gradient norm must equal, to 1e-5 relative, those of the
data-parallel run without sequence parallelism on the same global batch: one process with the whole batch, which
the 2-rank data-parallel run equals (tests/distributed/test_data_parallel_step.py).
"""

import pytest
import torch
from _batches import qwen2, uneven_batch
from _spawn import spawn

from fastrl.losses import LossConfig
from fastrl.trainer import distributed as dist_utils
from fastrl.trainer.fsdp import shard_model
from fastrl.trainer.sequence_parallel import group_ranks, init_sequence_parallel
from fastrl.trainer.update import StepSettings, train_step

CONFIG = LossConfig(loss_agg="token-mean", eps_high=0.28)
BUDGET = 40
KEYS = ("loss", "entropy_mean", "grad_norm")


def step(model, samples, sequence=None) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = train_step(model, opt, samples, StepSettings(CONFIG, BUDGET, True, 0, sequence=sequence))
    return {k: out[k] for k in KEYS}


def _worker(rank, world, out_dir):
    sp = init_sequence_parallel(2)
    assert (sp.dp_size, sp.dp_rank, sp.rank) == (2, rank // 2, rank % 2)
    samples = dist_utils.shard(uneven_batch(), sp.dp_size, sp.dp_rank)
    results = {fsdp: step(shard_model(qwen2(2)) if fsdp else qwen2(2), samples, sp) for fsdp in (False, True)}
    torch.save(results, f"{out_dir}/rank{rank}.pt")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_dp2_sp2_takes_the_data_parallel_step(tmp_path):
    spawn(_worker, 4, tmp_path, str(tmp_path))
    torch.set_num_threads(1)
    ref = step(qwen2(2), uneven_batch())
    assert ref["loss"] != 0 and ref["grad_norm"] > 0
    for r in range(4):
        got = torch.load(tmp_path / f"rank{r}.pt")
        for fsdp, metrics in got.items():
            for k in KEYS:
                assert metrics[k] == pytest.approx(ref[k], rel=1e-5), (r, "fsdp" if fsdp else "replicated", k)


def test_group_ranks():
    """Sequence groups are consecutive ranks; a data-parallel group holds one block of every replica."""
    assert group_ranks(4, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    assert group_ranks(6, 3) == ([[0, 1, 2], [3, 4, 5]], [[0, 3], [1, 4], [2, 5]])
    assert group_ranks(2, 2) == ([[0, 1]], [[0], [1]])
