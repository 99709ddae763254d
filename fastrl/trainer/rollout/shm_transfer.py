"""A shared-memory weight-transfer engine for vLLM's CPU build, registered with vLLM's own factories.

vLLM's weight-transfer API (`vllm/distributed/weight_transfer/`) pairs a worker-side engine, created by the
inference worker when the engine is built with `weight_transfer_config={"backend": ...}`, with a trainer-side
engine that drives `init_weight_transfer_engine` / `start_weight_update` / `update_weights` /
`finish_weight_update` through a client. Its built-in backends need GPUs (`nccl`, `ipc`); this one moves the
weights through one file in /dev/shm that both processes map:

- `init`: the trainer lays every parameter out at a 64-byte aligned offset in a file it creates, and sends
  the layout; the worker maps the file and answers; the trainer then unlinks the path (the mappings stay),
  so a killed run leaves nothing behind in /dev/shm.
- each update: the trainer copies its parameters into the mapping, then drives start / update / finish; the
  worker loads the mapped tensors with vLLM's layer-wise reload, as the `nccl` engine does (the CPU build
  repacks its linear weights for oneDNN after loading: plain `load_weights` would leave stale packed copies).
  The trainer writes again only after `finish_weight_update` returned, so the worker never reads a torn copy.

The base `update_weights` ends with `torch.accelerator.synchronize()`, which raises on CPU-only torch
("Cannot access accelerator device when none is available."; vLLM's CPU worker replaces it with a no-op
when it loads); this engine's override has nothing to wait for and does not rely on that patch.
"""

import os
import tempfile
import uuid
from dataclasses import asdict, dataclass
from typing import ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

BACKEND = "fastrl_shm"
_ALIGN = 64


@dataclass
class ShmInitInfo(WeightTransferInitInfo):
    path: str
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    offsets: list[int]  # byte offset of each tensor in the file
    nbytes: int


@dataclass
class ShmUpdateInfo(WeightTransferUpdateInfo):
    version: int  # the policy version the mapping now holds (for the error message of a mismatch)


def layout(tensors) -> tuple[list[int], int]:
    """64-byte aligned byte offsets of `tensors` laid out one after another, and the total size."""
    offsets, pos = [], 0
    for t in tensors:
        offsets.append(pos)
        pos += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
    return offsets, max(pos, _ALIGN)


def map_views(path: str, names, dtype_names, shapes, offsets, nbytes) -> dict[str, torch.Tensor]:
    """Tensors viewing the shared file at `path` (MAP_SHARED: writes show in every process that maps it)."""
    buf = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
    views = {}
    for name, dtype_name, shape, off in zip(names, dtype_names, shapes, offsets):
        dtype = getattr(torch, dtype_name)
        n = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        views[name] = buf[off : off + n].view(dtype).view(shape)
    return views


class ShmWeightTransferEngine(WeightTransferEngine[ShmInitInfo, ShmUpdateInfo]):
    """Worker side: reads the trainer's weights from the shared mapping into the served model."""

    init_info_cls = ShmInitInfo
    update_info_cls = ShmUpdateInfo
    supports_draft_weight_update = False

    def init_transfer_engine(self, init_info: ShmInitInfo) -> None:
        self.views = map_views(init_info.path, init_info.names, init_info.dtype_names, init_info.shapes,
                               init_info.offsets, init_info.nbytes)  # fmt: skip

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict) -> None:
        self.receive_weights(self.parse_update_info(update_info))  # CPU: nothing in flight to synchronize

    def receive_weights(self, update_info: ShmUpdateInfo) -> None:
        if not getattr(self, "views", None):
            raise RuntimeError(f"{BACKEND}: update (version {update_info.version}) before init_weight_transfer_engine")
        self.model.load_weights(iter(self.views.items()))

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        self.views = {}


@dataclass
class ShmTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = BACKEND

    shm_dir: str = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class ShmTrainerWeightTransferEngine(TrainerWeightTransferEngine[ShmTrainerInitInfo]):
    """Trainer side: writes the `WeightSource` into the shared mapping and drives the update through the client."""

    init_info_cls = ShmTrainerInitInfo

    @classmethod
    def trainer_init(cls, init_info: ShmTrainerInitInfo, *, client, source=None) -> "ShmTrainerWeightTransferEngine":
        if source is None:
            raise ValueError(f"the {BACKEND} weight transfer needs a WeightSource")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        if not engine.is_sender:
            return engine
        meta = source.metadata()
        offsets, nbytes = layout([torch.empty(m.shape, dtype=m.dtype, device="meta") for m in meta])
        path = os.path.join(init_info.shm_dir, f"fastrl-weights-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        with open(path, "wb") as f:
            f.truncate(nbytes)
        try:
            info = ShmInitInfo(path, [m.name for m in meta], [str(m.dtype).removeprefix("torch.") for m in meta],
                               [list(m.shape) for m in meta], offsets, nbytes)  # fmt: skip
            engine.views = map_views(**asdict(info))
            client.init_weight_transfer_engine(asdict(info))
        finally:
            os.unlink(path)  # both sides hold their mappings
        return engine

    def send_weights(self, version: int = 0) -> None:
        """Copy the source's tensors into the mapping, then have the worker load them as `version`."""
        if not self.is_sender:
            for _ in self.source:  # stay in the trainer-side gathers of a sharded model
                pass
            return
        with torch.no_grad():
            for name, tensor in self.source:
                self.views[name].copy_(tensor.detach())
        self.client.start_weight_update()
        self.client.update_weights({"version": version})
        self.client.finish_weight_update(str(version))


def register() -> None:
    """Make BACKEND known to vLLM's worker- and trainer-side factories (once per process)."""
    for factory, cls in ((WeightTransferEngineFactory, ShmWeightTransferEngine),
                         (WeightTransferTrainerFactory, ShmTrainerWeightTransferEngine)):  # fmt: skip
        try:
            factory.register_engine(BACKEND, cls)
        except ValueError:  # already registered in this process
            pass
