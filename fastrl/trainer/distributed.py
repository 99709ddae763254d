"""torch.distributed helpers: data parallelism by sharding prompts, summing gradients and counts.

Launched with `torchrun --nproc-per-node N`, each rank samples completions for its own slice of the
step's prompts and backpropagates its own micro-batches. Because every rank divides by the GLOBAL
normalizer, SUM-all-reducing the gradients gives exactly the gradient of the whole batch (no averaging,
and no DDP wrapper whose forward hooks the body-only forward would bypass). Without a process group
every helper is the identity, so single-process code paths are the same.
"""

import os

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def init_from_env(device: torch.device | str) -> bool:
    """Join the process group torchrun describes in the environment. True if this call created it.

    A CUDA `device` must carry its index (`build.resolve_device` picks it): it becomes this process's device.
    """
    device = torch.device(device)
    if device.type == "cuda":
        if device.index is None:
            raise ValueError(f"init_from_env needs a CUDA device with its index, got {str(device)!r}")
        torch.cuda.set_device(device)
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or is_distributed():
        return False
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return True


def gpu_uuid(index: int) -> str:
    """The UUID of CUDA device `index` in this process's numbering (what the start-up check compares)."""
    return str(torch.cuda.get_device_properties(index).uuid)


def gather_objects(obj) -> list:
    """`obj` of every rank, in rank order (`[obj]` without a process group)."""
    if not is_distributed():
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def _device() -> torch.device:
    if is_distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(value: float, group=None) -> float:
    return all_reduce_sum_list([value], group)[0]


def all_reduce_sum_list(values: list[float], group=None) -> list[float]:
    """Sums over `group` (None: every rank; under sequence parallelism, the data-parallel group)."""
    if not is_distributed():
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=_device())
    dist.all_reduce(t, group=group)
    return t.tolist()


def all_reduce_max(value: float, group=None) -> float:
    if not is_distributed():
        return float(value)
    t = torch.tensor([value], dtype=torch.float64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t)


BUCKET_BYTES = 32 << 20  # gradients all-reduced together in one flat buffer, up to this size


def all_reduce_grads(params: list[torch.Tensor]) -> None:
    """Sum gradients over ranks, in place. Consecutive small gradients of one dtype go in flat buffers of up to
    `BUCKET_BYTES` (fewer collectives); a larger one is reduced by itself, so no copy of every gradient at once
    is made. A rank without a gradient for a parameter sends zeros."""
    if not is_distributed():
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[torch.Tensor] = []
    size = 0
    for p in params:
        nbytes = p.grad.numel() * p.grad.element_size()
        if bucket and (size + nbytes > BUCKET_BYTES or p.grad.dtype != bucket[0].dtype):
            _all_reduce_bucket(bucket)
            bucket, size = [], 0
        bucket.append(p.grad)
        size += nbytes
    if bucket:
        _all_reduce_bucket(bucket)


def _all_reduce_bucket(grads: list[torch.Tensor]) -> None:
    if len(grads) == 1 and grads[0].is_contiguous():
        dist.all_reduce(grads[0])
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def shard(items: list, n_ranks: int | None = None, r: int | None = None) -> list:
    """This rank's contiguous slice of `items` (len(items) must split evenly)."""
    n_ranks = world_size() if n_ranks is None else n_ranks
    r = rank() if r is None else r
    if len(items) % n_ranks:
        raise ValueError(f"{len(items)} items do not split evenly over {n_ranks} ranks")
    k = len(items) // n_ranks
    return items[r * k : (r + 1) * k]


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def cleanup() -> None:
    """Tear the group down once every rank is done with it (no rank closes a link a peer still reads)."""
    if is_distributed():
        dist.barrier()
        dist.destroy_process_group()
