"""The colocated weight push over vLLM's `ipc` engine: what can be checked without a GPU (the shared buffer's size
and the rank checks). The transfer itself needs CUDA IPC: `python -m bench.gpu`'s `async` part runs it."""

import pytest
import torch
from vllm.distributed.weight_transfer.packed_tensor import DEFAULT_PACKED_BUFFER_SIZE_BYTES

from fastrl.trainer.rollout.ipc_weights import IpcWeightPush, buffer_bytes
from fastrl.trainer.rollout.nccl_weights import CastSource


def test_the_buffer_holds_the_largest_tensor_in_vllms_dtype():
    """vLLM's packed producer refuses a tensor larger than its buffer (1 GiB by default): a 7B model's embedding in
    bfloat16 is larger, so the buffer grows to it; a small model keeps vLLM's default."""
    with torch.device("meta"):
        big = torch.nn.Embedding(152_064, 3_584)  # Qwen2.5-7B's: 1.09e9 bytes in bfloat16, 2.18e9 in float32
        small = torch.nn.Linear(8, 8)
    assert buffer_bytes(CastSource(big, torch.bfloat16)) == 152_064 * 3_584 * 2 > DEFAULT_PACKED_BUFFER_SIZE_BYTES
    assert buffer_bytes(CastSource(big, torch.float32)) == 152_064 * 3_584 * 4
    assert buffer_bytes(CastSource(small, torch.bfloat16)) == DEFAULT_PACKED_BUFFER_SIZE_BYTES


@pytest.mark.parametrize("rank, rollout", [(0, None), (1, object())], ids=["rank0-without-client", "rank1-with"])
def test_only_rank_zero_holds_the_rollout_client(rank, rollout):
    with pytest.raises(ValueError, match=f"trainer rank {rank}"):
        IpcWeightPush(rollout, torch.nn.Linear(2, 2), "bfloat16", rank=rank)
