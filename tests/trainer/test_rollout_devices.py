"""The rollout device plan over fake device lists: which GPU each trainer rank uses, what the rollout process
sees, and every refusal naming its bad value."""

import multiprocessing
import os

import pytest

from fastrl.trainer.rollout import devices
from fastrl.trainer.rollout.devices import (
    DEDICATED_MEMORY_FRACTION,
    check_rank_uuids,
    parse_gpu_ids,
    plan_devices,
    visible_devices_for_children,
    visible_gpu_ids,
    weight_backend,
)


def _plan(rollout="6,7", visible=None, count=8, local_world_size=6, k=1, device_type="cuda"):
    return plan_devices(parse_gpu_ids(rollout), visible_gpu_ids(visible, count), local_world_size,
                        async_staleness=k, device_type=device_type)  # fmt: skip


def test_eight_gpus_six_ranks_two_rollout():
    plan = _plan()
    assert plan.trainer_devices == (0, 1, 2, 3, 4, 5)
    assert plan.rollout_visible == "6,7"
    assert plan.tensor_parallel_size == 2
    assert plan.weight_backend == "nccl"
    assert plan.gpu_memory_utilization == DEDICATED_MEMORY_FRACTION


def test_rollout_gpus_in_the_middle_and_a_restricted_launcher():
    # the launcher sees physical 3,1,5,7 as its devices 0..3; the rollout takes physical 5
    plan = _plan(rollout="5", visible="3,1,5,7", local_world_size=3)
    assert plan.trainer_devices == (0, 1, 3)  # physical 3, 1, 7 in the launcher's numbering
    assert plan.rollout_visible == "5"
    assert plan.tensor_parallel_size == 1


def test_rollout_order_is_kept_for_the_child():
    assert _plan(rollout="7,6").rollout_visible == "7,6"


def test_fewer_ranks_than_gpus_left():
    assert _plan(local_world_size=2).trainer_devices == (0, 1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        pytest.param(dict(rollout="8"), "GPU 8, which is not visible", id="not-visible"),
        pytest.param(dict(rollout="2", visible="0,1,3"), "GPU 2, which is not visible", id="hidden-by-launcher"),
        pytest.param(dict(rollout="6,7", local_world_size=7), "7 trainer ranks need 7 GPUs, but only 6", id="few"),
        pytest.param(dict(k=-1), "needs --async-staleness >= 0", id="sync"),
        pytest.param(dict(device_type="cpu"), "needs the trainer on CUDA, got device type 'cpu'", id="cpu"),
        pytest.param(dict(local_world_size=0), "local_world_size must be >= 1, got 0", id="no-ranks"),
    ],
)
def test_plan_refusals(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _plan(**kwargs)


def test_plan_refuses_a_repeated_id_given_as_a_list():
    with pytest.raises(ValueError, match="names GPU 6 more than once"):
        plan_devices([6, 6], list(range(8)), 2, async_staleness=0, device_type="cuda")


def test_plan_refuses_no_rollout_gpu():
    with pytest.raises(ValueError, match="names no GPU"):
        plan_devices([], list(range(8)), 2, async_staleness=0, device_type="cuda")


@pytest.mark.parametrize(
    "text, match",
    [
        pytest.param("6,6", "names GPU 6 more than once", id="repeated"),
        pytest.param("6,x", "comma-separated GPU ids", id="not-a-number"),
        pytest.param("", "comma-separated GPU ids", id="empty"),
        pytest.param("-1", "comma-separated GPU ids", id="negative"),
    ],
)
def test_parse_refusals(text, match):
    with pytest.raises(ValueError, match=match):
        parse_gpu_ids(text)


def test_parse_spaces():
    assert parse_gpu_ids(" 6, 7 ") == (6, 7)


def test_visible_ids():
    assert visible_gpu_ids(None, 4) == (0, 1, 2, 3)
    assert visible_gpu_ids("2,0", 4) == (2, 0)
    assert visible_gpu_ids("", 4) == ()
    with pytest.raises(ValueError, match="'GPU-0a1b'"):
        visible_gpu_ids("GPU-0a1b", 4)


def test_uuid_check_accepts_disjoint_gpus():
    check_rank_uuids(["GPU-a", "GPU-b"], ["GPU-c", "GPU-d"])


def test_uuid_check_names_the_rank_on_a_rollout_gpu():
    # a rank whose own CUDA_VISIBLE_DEVICES puts a rollout GPU at its index 0: same index, different GPU
    with pytest.raises(ValueError, match="trainer rank 2 uses GPU GPU-d, which --rollout-gpus gives"):
        check_rank_uuids(["GPU-a", "GPU-b", "GPU-d"], ["GPU-c", "GPU-d"])


def test_uuid_check_refuses_two_ranks_on_one_gpu():
    with pytest.raises(ValueError, match="trainer ranks 0 and 1 share GPU GPU-a"):
        check_rank_uuids(["GPU-a", "GPU-a"], ["GPU-c"])


def test_plan_and_uuid_check_agree_on_a_real_layout():
    """The plan's trainer devices, mapped through a fake UUID table, never meet the rollout GPUs' UUIDs."""
    visible = visible_gpu_ids("7,6,5,4,3,2,1,0", 8)
    uuid_of = {gpu: f"GPU-{gpu:02d}" for gpu in range(8)}
    plan = plan_devices(parse_gpu_ids("0,3"), visible, 6, async_staleness=1, device_type="cuda")
    rank_uuids = [uuid_of[visible[i]] for i in plan.trainer_devices]
    check_rank_uuids(rank_uuids, [uuid_of[g] for g in (0, 3)])
    assert sorted(rank_uuids) == ["GPU-01", "GPU-02", "GPU-04", "GPU-05", "GPU-06", "GPU-07"]


@pytest.mark.parametrize(
    "device_type, rollout, expected",
    [
        pytest.param("cpu", (), "fastrl_shm", id="cpu"),
        pytest.param("cuda", (6, 7), "nccl", id="cuda-dedicated"),
        pytest.param("cuda", (), "ipc", id="cuda-colocated"),
    ],
)
def test_weight_backend(device_type, rollout, expected):
    assert weight_backend(device_type, rollout) == expected


@pytest.mark.parametrize(
    "device_type, rollout, match",
    [
        pytest.param("cpu", (6,), "--rollout-gpus 6 needs the trainer on CUDA", id="cpu-with-gpus"),
        pytest.param("mps", (), "device type 'mps'", id="mps"),
    ],
)
def test_weight_backend_refusals(device_type, rollout, match):
    with pytest.raises(ValueError, match=match):
        weight_backend(device_type, rollout)


def test_plan_uses_the_dedicated_fraction_above_the_colocated_default():
    from fastrl.trainer.config import TrainConfig

    assert devices.DEDICATED_MEMORY_FRACTION > TrainConfig.vllm_gpu_memory_utilization


@pytest.mark.parametrize("before", [None, "0,1,2,3,4,5,6,7"], ids=["unset", "set"])
def test_visible_devices_for_children_restores_the_parent(monkeypatch, before):
    if before is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", before)
    with visible_devices_for_children(_plan().rollout_visible):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "6,7"
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == before


@pytest.mark.parametrize("visible", ["", "6,", "GPU-ab"])
def test_visible_devices_for_children_refuses(visible):
    with pytest.raises(ValueError, match=repr(visible)):
        with visible_devices_for_children(visible):
            pass


def _report_visible(out) -> None:
    out.put(os.environ.get("CUDA_VISIBLE_DEVICES"))


@pytest.mark.slow
def test_a_spawned_child_sees_only_the_rollout_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_report_visible, args=(out,))
    with visible_devices_for_children("6,7"):
        child.start()
    try:
        assert out.get(timeout=120) == "6,7"
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
