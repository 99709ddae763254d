"""The trainer's weights to a rollout process on GPUs of its own, over vLLM's `nccl` weight-transfer engine.

Trainer rank 0 is NCCL rank 0 and the sender; the rollout engine's GPUs are ranks 1.. (tensor parallel). Every
trainer rank runs `push` (an FSDP model's full tensors are gathered collectively, one at a time); only rank 0
talks to the rollout process. What travels:

- one tensor at a time, cast to vLLM's dtype on the way (`CastSource`), packed into vLLM's fixed-size buckets
  (`packed=True`): never a full fp32 state dict, on the trainer or in host memory;
- the version label WITH the weights: vLLM's engine ends an update with `finish_weight_update()` and no label, so
  a label set by a later call would let an engine step sample new weights under the old label. `LabelledClient`
  adds the label to that same call; the rollout process applies both between the same two engine steps.

NCCL's broadcast has no timeout: if the rollout process dies mid-transfer the sender would wait forever.
`Watchdog` polls the process while the transfer runs and aborts the communicator (NCCL's `ncclCommAbort`, which
ends the pending broadcast) when it has died; `push` then raises. The receiving side keeps its heartbeat
going during a long receive with `beating` (a receive can outlast `rollout_timeout_s` on a large model).
"""

import contextlib
import threading
import time
from collections.abc import Callable

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine

from ..fsdp import full_state_items


class TransferAborted(RuntimeError):
    """The rollout process died during a weight transfer; the transfer group was aborted."""


def vllm_dtype(name: str) -> torch.dtype:
    """vLLM's `dtype` setting ("bfloat16", "float16", "float32") as a torch dtype."""
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"vLLM dtype must be a floating torch dtype name such as 'bfloat16', got {name!r}")
    return dtype


class CastSource(WeightSource):
    """The model's state, one tensor at a time, its floating tensors cast to `dtype` (vLLM's)."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype):
        self.model, self.dtype = model, dtype

    def _cast(self, dtype: torch.dtype) -> torch.dtype:
        return self.dtype if dtype.is_floating_point else dtype

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(name, self._cast(t.dtype), tuple(t.shape)) for name, t in self.model.state_dict().items()]

    def __iter__(self):
        for name, t in full_state_items(self.model):
            yield name, t.detach().to(self._cast(t.dtype))


class LabelledClient:
    """vLLM's `VLLMWeightSyncClient` over the rollout client, its `finish_weight_update` carrying `version`."""

    def __init__(self, rollout):
        self.rollout, self.version = rollout, None

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.rollout.init_weight_transfer_engine(init_info)

    def start_weight_update(self) -> None:
        if self.version is None:
            raise RuntimeError("a weight update needs its version label first")
        self.rollout.start_weight_update()

    def update_weights(self, update_info) -> None:
        self.rollout.update_weights(update_info)

    def finish_weight_update(self) -> None:
        self.rollout.finish_weight_update(weight_version=self.version)


class Watchdog:
    """While open, poll `alive()` every `period_s`; the first time it is False, call `abort()` once."""

    def __init__(self, alive: Callable[[], bool], abort: Callable[[], None], period_s: float = 0.5):
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.alive, self.abort, self.period_s = alive, abort, period_s
        self.tripped = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fastrl-transfer-watchdog", daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(self.period_s):
            if not self.alive():
                self.tripped = True
                self.abort()
                return

    def __enter__(self) -> "Watchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(self.period_s + 10.0)
        if self.tripped:
            raise TransferAborted("the rollout process died during a weight transfer; the transfer was aborted")


@contextlib.contextmanager
def beating(beat, period_s: float = 1.0):
    """Write `time.monotonic()` to the shared heartbeat every `period_s` while the block runs (a long receive)."""
    if not period_s > 0:
        raise ValueError(f"period_s must be > 0, got {period_s}")
    stop = threading.Event()

    def keep() -> None:
        while not stop.wait(period_s):
            beat.value = time.monotonic()

    thread = threading.Thread(target=keep, name="fastrl-receive-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(period_s + 5.0)
        beat.value = time.monotonic()


class NcclWeightPush:
    """Send the model's weights to the rollout process over vLLM's `nccl` engine (every trainer rank builds one).

    Args:
        rollout: the `AsyncRollout` on trainer rank 0; None on the other ranks.
        model: the policy (FSDP-sharded or not).
        dtype: vLLM's dtype name (the rollout spec's `dtype`).
        rank: this trainer rank; 0 is the sender.
        master_address, master_port: the transfer group's rendezvous (rank 0's host, a free port).
        world_size: 1 + the rollout engine's GPU count (its tensor parallel size).
        watch_period_s: how often the watchdog checks that the rollout process lives.
    """

    def __init__(self, rollout, model, dtype: str, *, rank: int, master_address: str, master_port: int,
                 world_size: int, watch_period_s: float = 0.5):  # fmt: skip
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        if (rollout is None) != (rank != 0):
            raise ValueError(f"trainer rank {rank} {'needs' if rank == 0 else 'must not have'} the rollout client")
        if world_size < 2:
            raise ValueError(f"world_size is 1 + the rollout GPUs, so >= 2, got {world_size}")
        self.rollout, self.watch_period_s = rollout, watch_period_s
        self.client = LabelledClient(rollout)
        info = NCCLTrainerInitInfo(rank=rank, master_address=master_address, master_port=master_port,
                                   world_size=world_size, packed=True)  # fmt: skip
        with self._watchdog():
            self.engine = NCCLTrainerWeightTransferEngine.trainer_init(
                info, client=self.client, source=CastSource(model, vllm_dtype(dtype))
            )

    def _watchdog(self):
        if self.rollout is None:
            return contextlib.nullcontext()
        return Watchdog(self.rollout.process.is_alive, self._abort, self.watch_period_s)

    def _abort(self) -> None:
        group = getattr(getattr(self, "engine", None), "model_update_group", None)
        if group is not None:
            group.destroy()  # ncclCommAbort: the pending broadcast returns

    def push(self, version: int) -> None:
        """Send the current weights; the rollout engine samples its next tokens as `version`."""
        if version < 0:
            raise ValueError(f"policy version must be >= 0, got {version}")
        self.client.version = str(version)
        with self._watchdog():
            self.engine.send_weights()

    def close(self) -> None:
        self.engine.shutdown()
