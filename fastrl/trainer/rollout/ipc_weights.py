"""The trainer's weights to a rollout process on the trainer's own GPU, over vLLM's `ipc` weight-transfer engine.

Colocated on CUDA (no `--rollout-gpus`): the rollout process's engine runs on trainer rank 0's GPU, so the weights
need not travel at all; vLLM's `ipc` engine (as in vLLM's colocated RL example) hands the receiver CUDA IPC handles
to memory the trainer filled, and the receiver copies from it into its layers. What is shared:

- one reusable GPU buffer (`packed=True`), filled tensor by tensor with the model's state cast to vLLM's dtype
  (`CastSource`), its handle sent per bucket; the buffer is sized to hold the largest tensor (vLLM's default size
  refuses a tensor larger than it, e.g. a 7B model's embedding), never a full state dict in host memory;
- the version label WITH the weights (`LabelledClient`, as for NCCL): the rollout process applies the last bucket
  and the label between the same two engine steps.

Every bucket's `update_weights` is a call the rollout process answers once it has copied the bucket, so the
trainer refills the buffer only after that (`AsyncRollout.call` waits for the answer, within `rollout_timeout_s`).
vLLM's engine gathers the handles over the default process group, so with several trainer ranks every rank runs
`push` (rank 0 sends); each rank's handles are keyed by its GPU's UUID, and the receiver takes its own GPU's.
"""

import math

from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo, IPCTrainerWeightTransferEngine
from vllm.distributed.weight_transfer.packed_tensor import DEFAULT_PACKED_BUFFER_SIZE_BYTES

from .nccl_weights import CastSource, LabelledClient, vllm_dtype


def buffer_bytes(source: CastSource) -> int:
    """The shared buffer's size: vLLM's default, or the largest tensor of `source` in vLLM's dtype if larger."""
    largest = max((m.dtype.itemsize * math.prod(m.shape) for m in source.metadata()), default=0)
    return max(DEFAULT_PACKED_BUFFER_SIZE_BYTES, largest)


class IpcWeightPush:
    """Send the model's weights to the colocated rollout process over vLLM's `ipc` engine (every trainer rank).

    Args:
        rollout: the `AsyncRollout` on trainer rank 0; None on the other ranks.
        model: the policy (FSDP-sharded or not).
        dtype: vLLM's dtype name (the rollout spec's `dtype`).
        rank: this trainer rank; 0 is the sender.
    """

    def __init__(self, rollout, model, dtype: str, *, rank: int):
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        if (rollout is None) != (rank != 0):
            raise ValueError(f"trainer rank {rank} {'needs' if rank == 0 else 'must not have'} the rollout client")
        self.client = LabelledClient(rollout)
        source = CastSource(model, vllm_dtype(dtype))
        info = IPCTrainerInitInfo(rank=rank, packed=True, packed_buffer_size_bytes=buffer_bytes(source))
        self.engine = IPCTrainerWeightTransferEngine.trainer_init(info, client=self.client, source=source)

    def push(self, version: int) -> None:
        """Send the current weights; the rollout engine samples its next tokens as `version`."""
        if version < 0:
            raise ValueError(f"policy version must be >= 0, got {version}")
        self.client.version = str(version)
        self.engine.send_weights()

    def close(self) -> None:
        self.engine.shutdown()
