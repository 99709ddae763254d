"""vLLM's `nccl` weight-transfer engine on the CPU: a gloo group behind the engine's seams, in both processes.

`install()` swaps, in the calling process, the engine's two group constructors (the trainer's endpoint and the
worker's), the accelerator's device index and the packed transfer's CUDA streams for CPU stand-ins; everything
else (packing, bucketing, unpacking, `load_weights`, the layerwise reload) is vLLM's own code. `worker_main`
is the rollout process's entry with the seams installed and a record of what the engine serves after each
update, fetched with the `served_log` RPC.
"""

import datetime

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=120)
SERVED = []  # (the worker's version label, {vLLM parameter name: tensor}) after each finished update


class GlooGroup:
    """The part of vLLM's `PyNcclCommunicator` the engine uses (broadcast, destroy), over gloo."""

    def __init__(self, address: str, port: int, rank: int, world_size: int):
        store = dist.TCPStore(address, port, world_size, rank == 0, timeout=TIMEOUT)
        self.group, self.rank = dist.ProcessGroupGloo(store, rank, world_size, TIMEOUT), rank

    def broadcast(self, tensor: torch.Tensor, src: int, stream=None) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        self.group.broadcast([tensor], opts).wait()

    def destroy(self) -> None:
        self.group = None


class _Stream:
    def synchronize(self) -> None:
        pass


def install(setattr=setattr) -> None:
    """Swap the seams in this process (`setattr`: pytest's `monkeypatch.setattr` undoes them after a test)."""
    from vllm.distributed.weight_transfer import nccl_engine, packed_tensor

    def trainer_endpoint(info, rank: int = 0):
        return GlooGroup(info.master_address, info.master_port, rank, info.world_size)

    def worker_group(info, parallel_config):
        return GlooGroup(info.master_address, info.master_port, info.rank_offset + parallel_config.rank,
                         info.world_size)  # fmt: skip

    setattr(nccl_engine, "open_trainer_endpoint", trainer_endpoint)
    setattr(nccl_engine, "worker_init_process_group", worker_group)
    setattr(torch.accelerator, "current_device_index", lambda: 0)
    setattr(packed_tensor, "_get_streams", lambda device_index, n: tuple(_Stream() for _ in range(n)))


def _plain_linear(layer, remove_weight: bool) -> None:
    layer.cpu_linear = torch.nn.functional.linear


def _served_state(worker) -> dict:
    return {name: p.detach().clone() for name, p in worker.get_model().named_parameters()}


def worker_main(spec, ctrl, out, beat, parent_pid: int) -> None:
    """`async_worker.worker_main` with the seams installed and each finished update's served weights recorded."""
    import vllm
    from vllm.model_executor.layers import utils

    from fastrl.trainer.rollout import async_worker

    install()
    # vLLM's CPU build repacks each linear weight into a oneDNN / SGL kernel handle and empties `layer.weight`;
    # plain `F.linear` on `layer.weight` keeps the served weights readable (the engine still samples with them)
    utils.dispatch_cpu_unquantized_gemm = _plain_linear
    apply = async_worker.RolloutWorker._apply

    def recording_apply(self, msg):
        apply(self, msg)
        if msg[0] == "rpc" and msg[1] == "finish_weight_update":
            SERVED.append((self.version, self.llm.collective_rpc(_served_state)[0]))

    async_worker.RolloutWorker._apply = recording_apply
    async_worker._RPCS.add("served_log")
    vllm.LLM.served_log = lambda self: list(SERVED)
    async_worker.worker_main(spec, ctrl, out, beat, parent_pid)
