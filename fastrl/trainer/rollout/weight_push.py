"""Push the trainer's weights to the rollout process on the CPU with the shared-memory engine (`shm_transfer`).

The engine drives the rollout process's `start_weight_update` / `update_weights` / `finish_weight_update`
through `AsyncRollout`, which applies them between two engine steps, the policy version with the weights. On
GPUs the weights go over vLLM's `nccl` engine instead (`nccl_weights.NcclWeightPush`).
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
    """The model's weights to the rollout process over the shared-memory engine (CPU; `nccl_weights` on GPUs)."""

    def __init__(self, rollout, model, rank: int = 0):
        self.rollout = rollout
        shm_transfer.register()
        info = shm_transfer.ShmTrainerInitInfo(rank=rank)
        self.engine = WeightTransferTrainerFactory.trainer_init(info, client=rollout, source=StateSource(model))

    def push(self, version: int) -> None:
        """Send the model's current weights; the rollout engine samples its next tokens as `version`."""
        if version < 0:
            raise ValueError(f"policy version must be >= 0, got {version}")
        self.engine.send_weights(version)

    def close(self) -> None:
        self.engine.shutdown()
