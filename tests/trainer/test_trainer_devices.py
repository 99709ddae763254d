"""Each trainer rank's GPU from the rollout device plan, over fake device lists, and the start-up check by UUID
across the ranks with the UUID query and the gather faked (no GPU here: the CUDA calls are the seams)."""

import pytest
import torch

from fastrl.trainer import build
from fastrl.trainer import distributed as dist_utils
from fastrl.trainer.config import make_config
from fastrl.trainer.rollout.devices import RankPlacement, place_rank, visible_gpu_ids


@pytest.mark.parametrize(
    "rollout, visible, ranks, devices, rollout_indices",
    [
        pytest.param("", "0,1,2,3", 4, [0, 1, 2, 3], (), id="no-rollout-gpus"),
        pytest.param("6,7", None, 6, [0, 1, 2, 3, 4, 5], (6, 7), id="last-two"),
        pytest.param("0,3", None, 6, [1, 2, 4, 5, 6, 7], (0, 3), id="first-and-fourth"),
        pytest.param("5", "3,1,5,7", 3, [0, 1, 3], (2,), id="restricted-launcher"),
        pytest.param("7,6", "7,6,5,4", 2, [2, 3], (0, 1), id="reversed-launcher"),
    ],
)
def test_each_rank_takes_a_gpu_the_rollout_process_does_not(rollout, visible, ranks, devices, rollout_indices):
    visible_ids = visible_gpu_ids(visible, 8)
    placed = [place_rank(r, ranks, visible_ids, rollout, async_staleness=1) for r in range(ranks)]
    assert [p.device for p in placed] == devices
    assert all(p.rollout == rollout_indices for p in placed)
    taken = {visible_ids[i] for i in rollout_indices}
    assert not taken & {visible_ids[d] for d in devices} and len(set(devices)) == ranks


@pytest.mark.parametrize(
    "kwargs, match",
    [
        pytest.param(dict(local_rank=6), "local rank 6 is outside the node's 6 trainer ranks", id="rank-outside"),
        pytest.param(dict(local_rank=-1), "local rank -1 is outside", id="negative-rank"),
        pytest.param(dict(visible=(0, 1), rollout=""), "local rank 2 has no GPU: 2 visible \\(0,1\\)", id="no-gpu"),
        pytest.param(dict(rollout="8"), "GPU 8, which is not visible", id="rollout-not-visible"),
        pytest.param(dict(rollout="5,6,7"), "6 trainer ranks need 6 GPUs, but only 5", id="too-few-left"),
        pytest.param(dict(rollout="6,x"), "comma-separated GPU ids", id="bad-ids"),
        pytest.param(dict(k=-1), "needs --async-staleness >= 0", id="synchronous"),
    ],
)
def test_place_rank_refusals(kwargs, match):
    args = dict(local_rank=2, local_world_size=6, visible=tuple(range(8)), rollout="6,7", k=0) | kwargs
    with pytest.raises(ValueError, match=match):
        place_rank(args["local_rank"], args["local_world_size"], args["visible"], args["rollout"], args["k"])


def test_resolve_device_follows_the_plan(monkeypatch):
    """Local rank 2 of 6 with rollout GPUs 0 and 3 of 8 runs on device 4, not on device 2 (its LOCAL_RANK)."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "6")
    config = make_config("tiny", engine="vllm", async_staleness=0, rollout_gpus="0,3", device="cuda")
    assert build.resolve_device(config) == (torch.device("cuda", 4), RankPlacement(4, (0, 3)))
    config = make_config("tiny", device="cuda")  # no rollout GPUs: the local rank's
    assert build.resolve_device(config) == (torch.device("cuda", 2), RankPlacement(2, ()))
    assert build.resolve_device(make_config("tiny", device="cpu")) == (torch.device("cpu"), None)


def _fake_ranks(monkeypatch, devices_of_ranks: list[int], uuid_of_rank0_node: dict, uuid_of_other_nodes=None):
    """Every rank's (own UUID, rollout UUIDs) as `gather_objects` would return them; rank 0 is this process."""
    monkeypatch.setattr(dist_utils, "gpu_uuid", lambda index: uuid_of_rank0_node[index])

    def gather(mine):
        lookup = uuid_of_other_nodes or uuid_of_rank0_node
        return [mine] + [(lookup[d], []) for d in devices_of_ranks[1:]]

    monkeypatch.setattr(dist_utils, "gather_objects", gather)


UUIDS = {i: f"GPU-{i:02d}" for i in range(8)}


def test_check_accepts_the_plans_devices(monkeypatch):
    _fake_ranks(monkeypatch, [0, 1, 2, 3, 4, 5], UUIDS)
    build.check_rank_gpus(RankPlacement(0, (6, 7)))


def test_check_names_a_rank_on_a_rollout_gpu(monkeypatch):
    # rank 3's launcher numbered the GPUs differently: its device 3 is the rollout's GPU-06
    _fake_ranks(monkeypatch, [0, 1, 2, 6, 4, 5], UUIDS)
    with pytest.raises(ValueError, match=r"trainer rank 3 uses GPU GPU-06, .*\(its GPUs: GPU-06, GPU-07\)"):
        build.check_rank_gpus(RankPlacement(0, (6, 7)))


def test_check_names_two_ranks_on_one_gpu(monkeypatch):
    _fake_ranks(monkeypatch, [0, 1, 1], UUIDS)
    with pytest.raises(ValueError, match="trainer ranks 1 and 2 share GPU GPU-01"):
        build.check_rank_gpus(RankPlacement(0, (6, 7)))


def test_check_reads_the_rollout_gpus_of_rank_0s_node(monkeypatch):
    """Ranks of another node on their devices 6 and 7 are not on the rollout GPUs: the UUIDs differ."""
    _fake_ranks(monkeypatch, [0, 6, 7], UUIDS, {i: f"GPU-node1-{i}" for i in range(8)})
    build.check_rank_gpus(RankPlacement(0, (6, 7)))


def test_one_process_checks_itself(monkeypatch):
    monkeypatch.setattr(dist_utils, "gpu_uuid", lambda index: UUIDS[index])
    build.check_rank_gpus(RankPlacement(0, (6, 7)))
    with pytest.raises(ValueError, match="trainer rank 0 uses GPU GPU-06"):
        build.check_rank_gpus(RankPlacement(6, (6, 7)))
