"""The asynchronous source on rollout GPUs, off a GPU: the plan from the `rollout_gpus` setting, the worker spec
built from it, and the start-up check and rendezvous every trainer rank runs (CUDA's device queries faked)."""

from types import SimpleNamespace

import pytest
import torch

from fastrl.trainer.async_source import nccl_link, on_devices
from fastrl.trainer.rollout.async_worker import WorkerSpec
from fastrl.trainer.rollout.devices import DEDICATED_MEMORY_FRACTION, plan_rollout

SPEC = WorkerSpec(model="m", dtype="bfloat16", max_model_len=64, seed=0, temperature=1.0, top_p=1.0, top_k=0,
                  min_p=0.0, max_tokens=32, min_tokens=0, stop_ids=(2,), gpu_memory_utilization=0.35)  # fmt: skip


def test_off_on_the_cpu_leaves_the_spec_as_it_was():
    assert plan_rollout("", "cpu", (), 1, async_staleness=0) is None
    assert on_devices(SPEC, None) is SPEC
    with pytest.raises(ValueError, match="needs the trainer on CUDA"):
        plan_rollout("6,7", "cpu", (), 1, async_staleness=0)


def test_cuda_without_rollout_gpus_is_colocated():
    # no plan: the rollout process shares trainer rank 0's GPU, the weights over vLLM's ipc engine
    assert plan_rollout("", "cuda", tuple(range(8)), 8, async_staleness=1) is None


def test_the_spec_runs_on_the_plans_gpus():
    plan = plan_rollout("6,7", "cuda", tuple(range(8)), 6, async_staleness=1)
    spec = on_devices(SPEC, plan)
    assert (spec.tensor_parallel_size, spec.backend) == (2, "nccl")
    assert spec.gpu_memory_utilization == DEDICATED_MEMORY_FRACTION
    assert spec.model == SPEC.model and spec.dtype == SPEC.dtype and spec.replay == SPEC.replay
    with pytest.raises(ValueError, match="GPU 9, which is not visible"):
        plan_rollout("9", "cuda", tuple(range(8)), 6, async_staleness=1)


def fake_cuda(monkeypatch, current: int):
    """Physical GPU i has UUID "GPU-i"; this process (CUDA_VISIBLE_DEVICES unset) is on device `current`."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=f"GPU-{i}"))


def test_rank_zero_checks_the_uuids_and_hands_out_the_rendezvous(monkeypatch):
    plan = plan_rollout("6,7", "cuda", tuple(range(8)), 6, async_staleness=1)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.5")
    fake_cuda(monkeypatch, current=0)
    address, port = nccl_link(plan, tuple(range(8)), rank=0)
    assert address == "10.0.0.5" and 0 < port < 65536
    fake_cuda(monkeypatch, current=7)  # a trainer rank that landed on a rollout GPU
    with pytest.raises(ValueError, match="trainer rank 0 uses GPU GPU-7"):
        nccl_link(plan, tuple(range(8)), rank=0)


def test_the_rollout_uuids_are_read_in_the_launchers_numbering(monkeypatch):
    """The launcher sees physical 3,1,5,7 as devices 0..3: rollout GPU 5 is its device 2."""
    plan = plan_rollout("5", "cuda", (3, 1, 5, 7), 3, async_staleness=1)
    fake_cuda(monkeypatch, current=2)
    with pytest.raises(ValueError, match="uses GPU GPU-2"):
        nccl_link(plan, (3, 1, 5, 7), rank=0)
    fake_cuda(monkeypatch, current=3)
    nccl_link(plan, (3, 1, 5, 7), rank=0)
