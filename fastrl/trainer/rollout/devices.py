"""Which GPU each trainer rank uses, which GPUs the rollout process sees, and how weights reach it.

`--rollout-gpus 6,7` names physical GPU ids (the namespace `CUDA_VISIBLE_DEVICES` uses). The rollout process
gets exactly those GPUs: its `CUDA_VISIBLE_DEVICES` is set to them before vLLM starts, and vLLM runs tensor
parallel over all of them. The trainer's local ranks take the launcher's other visible GPUs in order (`place_rank`;
without rollout GPUs, local rank r takes device r). Device
indices are the only thing two processes can disagree on (each process numbers its visible GPUs from 0), so the
start-up check that no trainer rank sits on a rollout GPU compares GPU UUIDs, gathered from every rank.

Everything here is a pure function of lists: the caller reads `CUDA_VISIBLE_DEVICES`, the device count and the
UUIDs, and passes them in.
"""

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

# vLLM's own default share of GPU memory: on a GPU the rollout engine holds alone, nothing else allocates there;
# the remaining 10% covers the CUDA context, NCCL's buffers and the allocator's fragmentation.
DEDICATED_MEMORY_FRACTION = 0.9


@dataclass(frozen=True)
class DevicePlan:
    trainer_devices: tuple[int, ...]  # per local rank: its CUDA device index in the launcher's numbering
    rollout_visible: str  # the rollout process's CUDA_VISIBLE_DEVICES, e.g. "6,7"
    tensor_parallel_size: int  # vLLM's tensor parallel size: every rollout GPU
    gpu_memory_utilization: float  # vLLM's share of each rollout GPU
    weight_backend: str  # vLLM's weight-transfer engine: "nccl"


def parse_gpu_ids(text: str) -> tuple[int, ...]:
    """`"6,7"` -> `(6, 7)`: physical GPU ids, each a non-negative integer, none repeated."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p.isdigit() for p in parts):
        raise ValueError(f"--rollout-gpus must be comma-separated GPU ids such as '6,7', got {text!r}")
    ids = tuple(int(p) for p in parts)
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ValueError(f"--rollout-gpus names GPU {repeated[0]} more than once ({text!r})")
    return ids


def visible_gpu_ids(cuda_visible_devices: str | None, device_count: int) -> tuple[int, ...]:
    """The launcher's GPUs as physical ids: its `CUDA_VISIBLE_DEVICES`, or all `device_count` when unset."""
    if cuda_visible_devices is None:
        return tuple(range(device_count))
    parts = [p.strip() for p in cuda_visible_devices.split(",") if p.strip()]
    if any(not p.isdigit() for p in parts):
        raise ValueError(f"--rollout-gpus needs CUDA_VISIBLE_DEVICES as integer GPU ids, got "
                         f"{cuda_visible_devices!r} (UUID and MIG forms do not match --rollout-gpus ids)")  # fmt: skip
    return tuple(int(p) for p in parts)


def plan_devices(
    rollout_gpus: Sequence[int],
    visible: Sequence[int],
    local_world_size: int,
    *,
    async_staleness: int,
    device_type: str,
) -> DevicePlan:
    """Split the node's GPUs between the trainer's local ranks and the rollout process.

    Args:
        rollout_gpus: physical ids for the rollout process (`parse_gpu_ids`), at least one.
        visible: the launcher's visible GPUs as physical ids, in its order (`visible_gpu_ids`).
        local_world_size: trainer ranks on this node; local rank r uses `trainer_devices[r]`.
        async_staleness: the trainer's K (< 0: synchronous, which has no rollout process).
        device_type: the trainer's device type ("cuda" or "cpu").
    Returns:
        the `DevicePlan`.
    """
    if device_type != "cuda":
        raise ValueError(f"--rollout-gpus needs the trainer on CUDA, got device type {device_type!r}")
    if async_staleness < 0:
        raise ValueError(f"--rollout-gpus needs --async-staleness >= 0 (a rollout process of its own), got "
                         f"async_staleness={async_staleness}")  # fmt: skip
    if not rollout_gpus:
        raise ValueError("--rollout-gpus names no GPU")
    if local_world_size < 1:
        raise ValueError(f"local_world_size must be >= 1, got {local_world_size}")
    for gpu in rollout_gpus:
        if rollout_gpus.count(gpu) > 1:
            raise ValueError(f"--rollout-gpus names GPU {gpu} more than once")
        if gpu not in visible:
            raise ValueError(f"--rollout-gpus names GPU {gpu}, which is not visible to the launcher (visible: "
                             f"{','.join(map(str, visible)) or 'none'})")  # fmt: skip
    left = [i for i, gpu in enumerate(visible) if gpu not in rollout_gpus]
    if len(left) < local_world_size:
        raise ValueError(f"{local_world_size} trainer ranks need {local_world_size} GPUs, but only {len(left)} of "
                         f"the {len(visible)} visible are left after --rollout-gpus "
                         f"{','.join(map(str, rollout_gpus))}")  # fmt: skip
    return DevicePlan(
        trainer_devices=tuple(left[:local_world_size]),
        rollout_visible=",".join(map(str, rollout_gpus)),
        tensor_parallel_size=len(rollout_gpus),
        gpu_memory_utilization=DEDICATED_MEMORY_FRACTION,
        weight_backend="nccl",
    )


def plan_rollout(rollout_gpus: str, device_type: str, visible: Sequence[int], local_world_size: int,
                 async_staleness: int) -> DevicePlan | None:  # fmt: skip
    """The asynchronous rollout process's devices from the `rollout_gpus` setting ("6,7"; "" off): None on the CPU
    without them (the shared-memory engine), a `DevicePlan` on CUDA with them, else the refusal of `weight_backend`
    or `plan_devices`."""
    ids = parse_gpu_ids(rollout_gpus) if rollout_gpus else ()
    if weight_backend(device_type, ids) != "nccl":
        return None
    return plan_devices(ids, visible, local_world_size, async_staleness=async_staleness, device_type=device_type)


@dataclass(frozen=True)
class RankPlacement:
    device: int  # this trainer rank's CUDA device index, in the launcher's numbering
    rollout: tuple[int, ...]  # the rollout GPUs' indices in the same numbering (empty: no GPUs of their own)


def place_rank(local_rank: int, local_world_size: int, visible: Sequence[int], rollout_gpus: str = "",
               async_staleness: int = -1) -> RankPlacement:  # fmt: skip
    """This trainer rank's GPU: its local rank's without `rollout_gpus` ("6,7"), else `plan_devices`' for it, so no
    trainer rank sits on a rollout GPU.

    Args:
        local_rank: this rank's index on its node (torchrun's LOCAL_RANK).
        local_world_size: trainer ranks on the node (LOCAL_WORLD_SIZE).
        visible: the launcher's visible GPUs as physical ids, in its order (`visible_gpu_ids`).
        rollout_gpus: the `rollout_gpus` setting, "" when the rollout process has no GPUs of its own.
        async_staleness: the trainer's K (< 0: synchronous).
    """
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local rank {local_rank} is outside the node's {local_world_size} trainer ranks")
    if not rollout_gpus:
        if local_rank >= len(visible):
            raise ValueError(f"local rank {local_rank} has no GPU: {len(visible)} visible "
                             f"({','.join(map(str, visible)) or 'none'})")  # fmt: skip
        return RankPlacement(local_rank, ())
    ids = parse_gpu_ids(rollout_gpus)
    plan = plan_devices(ids, visible, local_world_size, async_staleness=async_staleness, device_type="cuda")
    return RankPlacement(plan.trainer_devices[local_rank], tuple(list(visible).index(g) for g in ids))


def check_rank_uuids(rank_uuids: Sequence[str], rollout_uuids: Sequence[str]) -> None:
    """Refuse a trainer rank whose GPU (by UUID, gathered from every rank) is one of the rollout GPUs.

    Args:
        rank_uuids: global rank r's GPU UUID at index r (e.g. `all_gather_object` of each rank's own).
        rollout_uuids: the rollout GPUs' UUIDs, read on the node that starts the rollout process.
    """
    taken = set(rollout_uuids)
    for rank, uuid in enumerate(rank_uuids):
        if uuid in taken:
            raise ValueError(f"trainer rank {rank} uses GPU {uuid}, which --rollout-gpus gives to the rollout "
                             f"process (its GPUs: {', '.join(rollout_uuids)}): set CUDA_VISIBLE_DEVICES so the "
                             "trainer ranks see the other GPUs")  # fmt: skip
    seen: dict[str, int] = {}
    for rank, uuid in enumerate(rank_uuids):
        if uuid in seen:
            raise ValueError(f"trainer ranks {seen[uuid]} and {rank} share GPU {uuid}")
        seen[uuid] = rank


def weight_backend(device_type: str, rollout_gpus: Sequence[int]) -> str:
    """vLLM's weight-transfer engine for the asynchronous rollout process.

    CPU: fastrl's shared-memory engine. CUDA with rollout GPUs of their own: `nccl` (trainer rank 0 the
    sender). CUDA without them: `ipc`, the rollout process on trainer rank 0's GPU (CUDA IPC handles, as vLLM's
    colocated RL example does; `ipc_weights.IpcWeightPush`). The shared-memory engine would copy a full state dict
    CUDA -> /dev/shm -> CUDA, so it is never used for CUDA tensors.
    """
    if device_type == "cpu":
        if rollout_gpus:
            raise ValueError(f"--rollout-gpus {','.join(map(str, rollout_gpus))} needs the trainer on CUDA")
        return "fastrl_shm"
    if device_type == "cuda":
        return "nccl" if rollout_gpus else "ipc"
    raise ValueError(f"no weight-transfer engine for device type {device_type!r}; use 'cpu' or 'cuda'")


@contextlib.contextmanager
def visible_devices_for_children(visible: str):
    """Within the block, processes started (spawned) see only the GPUs `visible` names ("6,7").

    Wrap the rollout process's `start()` in it: a spawned child takes the parent's environment at start, so
    vLLM (and its tensor parallel workers) see the rollout GPUs, numbered from 0, before CUDA initialises there.
    The parent's own environment is restored on exit (its CUDA context, if any, is unaffected either way).
    """
    if not visible or any(not p.isdigit() for p in visible.split(",")):
        raise ValueError(f"CUDA_VISIBLE_DEVICES for the rollout process must be GPU ids such as '6,7', got {visible!r}")
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    try:
        yield
    finally:
        if before is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
