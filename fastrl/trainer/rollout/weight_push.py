"""Push the trainer's weights to the rollout process with vLLM's trainer-side weight-transfer engines.

CPU: the shared-memory engine (`shm_transfer`). GPU: vLLM's `nccl` engine (the rollout engine on its own
GPUs, the trainer as NCCL rank 0); only its import is checked off a GPU. Either way the engine drives the
rollout process's `start_weight_update` / `update_weights` / `finish_weight_update` through `AsyncRollout`,
which applies them between two engine steps, then labels the new weights with their policy version.
"""

from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

from ..fsdp import full_state_items, is_sharded
from . import shm_transfer


class StateSource(WeightSource):
    """The model's state dict as vLLM's `WeightSource`: what the in-process engine's reload is given too.

    A sharded (FSDP) model's tensors are gathered one at a time; its state dict's shapes are the full ones.
    """

    def __init__(self, model):
        self.model = model

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self.model.state_dict().items()]

    def __iter__(self):
        if is_sharded(self.model):
            yield from full_state_items(self.model)
        else:
            yield from self.model.state_dict().items()


class WeightPush:
    def __init__(self, rollout, model, backend: str = "fastrl_shm", rank: int = 0, nccl: dict | None = None):
        """`nccl`: master_address, master_port, world_size (1 + the rollout engine's GPUs) for backend "nccl"."""
        self.rollout, self.backend = rollout, backend
        if backend == shm_transfer.BACKEND:
            shm_transfer.register()
            info = shm_transfer.ShmTrainerInitInfo(rank=rank)
        elif backend == "nccl":
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            if not nccl:
                raise ValueError("backend='nccl' needs nccl={master_address, master_port, world_size}")
            info = NCCLTrainerInitInfo(rank=rank, **nccl)
        else:
            raise ValueError(f"unknown weight-transfer backend {backend!r}; use {shm_transfer.BACKEND!r} or 'nccl'")
        self.engine = WeightTransferTrainerFactory.trainer_init(info, client=rollout, source=StateSource(model))

    def push(self, version: int) -> None:
        """Send the model's current weights; the rollout engine samples its next tokens as `version`."""
        if version < 0:
            raise ValueError(f"policy version must be >= 0, got {version}")
        if self.backend == shm_transfer.BACKEND:
            self.engine.send_weights(version)
        else:
            self.engine.send_weights()
            if self.engine.is_sender:
                self.rollout.update_weight_version(str(version))

    def close(self) -> None:
        self.engine.shutdown()
