"""Sharded, atomic checkpoints of an FSDP2 run, with torch.distributed.checkpoint (DCP).

Every rank writes its own shards of the model and AdamW state into one temporary directory; rank 0
adds the scheduler, step, prompt-stream position and run config, every rank its RNG states. Once all
ranks are done (DCP's metadata is written last, then a barrier) rank 0 fsyncs the directory and renames
it into place, so a kill of any rank at any moment leaves the previous complete checkpoint and never a
half-written `step-N` (the same guarantee as the replicated `checkpoint.py`, same directory names):

    <output_dir>/checkpoints/step-00000040/.metadata, __<rank>_0.distcp   model + optimizer shards
    <output_dir>/checkpoints/step-00000040/state.pt                       scheduler, step, data position
    <output_dir>/checkpoints/step-00000040/rng-rank<r>.pt                 each rank's RNG states

`--resume` needs the same world size (each rank continues its own RNG stream and prompt shard).
`export_hf` turns a checkpoint into a plain Hugging Face model directory, in one process.
"""

import os

import torch

from . import distributed as dist_utils
from .checkpoint import save_state, set_rng_state, write_staged
from .fsdp import is_sharded

__all__ = ["export_hf", "is_sharded_checkpoint", "load_sharded", "save_sharded"]

METADATA = ".metadata"  # DCP's index, written after every shard


def is_sharded_checkpoint(path: str) -> bool:
    return os.path.exists(os.path.join(path, METADATA))


def _tensor_state(model, optimizer, ref_model=None) -> dict:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    for m in (model, ref_model):
        if m is not None and is_sharded(m):
            m.reshard()  # a generate (no backward) may have left the root group gathered

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    if ref_model is not None:
        state["ref_model"] = get_model_state_dict(ref_model)
    return state


def save_sharded(output_dir: str, step: int, model, optimizer, scheduler, extra: dict, keep: int = 2, ref_model=None):
    """Write checkpoint `step` (every rank calls this). Returns its path."""
    import torch.distributed.checkpoint as dcp

    def write(tmp: str) -> None:
        dcp.save(_tensor_state(model, optimizer, ref_model), storage_writer=dcp.FileSystemWriter(tmp, sync_files=True))
        if dist_utils.rank() == 0:
            save_state(tmp, {"step": step, "world_size": dist_utils.world_size(), "scheduler": scheduler.state_dict(),
                             **extra})  # fmt: skip

    return write_staged(output_dir, step, keep, write, manifest=False)


def load_sharded(path: str, model, optimizer, scheduler, ref_model=None) -> dict:
    """Restore shards, scheduler and this rank's RNG from `path`; return the saved state's other fields."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    if not is_sharded_checkpoint(path):
        raise ValueError(f"{path} is not a sharded checkpoint (no {METADATA}): it was written without --fsdp")
    state = torch.load(os.path.join(path, "state.pt"), map_location="cpu", weights_only=False)
    if state["world_size"] != dist_utils.world_size():
        raise ValueError(
            f"{path} was written by {state['world_size']} ranks; resume it with the same number, "
            f"not {dist_utils.world_size()}"
        )
    tensors = _tensor_state(model, optimizer, ref_model)
    dcp.load(tensors, storage_reader=dcp.FileSystemReader(path))
    set_state_dict(model, optimizer, model_state_dict=tensors["model"], optim_state_dict=tensors["optimizer"])
    if ref_model is not None:
        set_model_state_dict(ref_model, tensors["ref_model"])
    scheduler.load_state_dict(state.pop("scheduler"))
    rng_file = os.path.join(path, f"rng-rank{dist_utils.rank()}.pt")
    set_rng_state(torch.load(rng_file, weights_only=False))
    return state


def export_hf(path: str, out_dir: str) -> str:
    """Write the policy of sharded checkpoint `path` as a Hugging Face model directory (one process).

    The model is rebuilt from the run's saved config (`model` and, for the built-in one, its sizes) and
    filled from the shards; the tokenizer is saved beside it when it is a Hugging Face one.
    """
    import torch.distributed.checkpoint as dcp

    from .config import make_config

    if not is_sharded_checkpoint(path):
        raise ValueError(f"{path} is not a sharded checkpoint (no {METADATA})")
    state = torch.load(os.path.join(path, "state.pt"), map_location="cpu", weights_only=False)
    config = make_config(**state["config"])
    from .tiny import built_in, tiny_model, tiny_tokenizer

    if built_in(config.model):
        tokenizer = None
        max_len = config.max_prompt_length + config.max_completion_length
        model = tiny_model(
            len(tiny_tokenizer(config)), config.tiny_hidden_size, config.tiny_layers, max_len=min(max_len, 4096)
        )
    else:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(config.model)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config.model), dtype=torch.float32)
    reader = dcp.FileSystemReader(path)
    saved = {k.split(".", 1)[1] for k in reader.read_metadata().state_dict_metadata if k.startswith("model.")}
    target = {k: t for k, t in model.state_dict().items() if k in saved}
    present = {t.data_ptr() for t in target.values()}
    missing = [k for k, t in model.state_dict().items() if k not in saved and t.data_ptr() not in present]
    if missing:  # a tied head shares its embedding's storage and may be absent; nothing else may
        raise ValueError(f"{path} lacks {missing[:3]}: it is not a checkpoint of this model ({config.model})")
    dcp.load({"model": target}, storage_reader=reader, no_dist=True)
    model.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir
