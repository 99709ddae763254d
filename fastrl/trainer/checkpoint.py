"""Atomic checkpoints: written to a temporary directory, then renamed into place.

A rename within one filesystem is atomic, so a kill at any moment leaves either the previous complete
checkpoint or the new complete one, never a half-written `step-N`. Layout:

    <output_dir>/checkpoints/step-00000040/state.pt       model, optimizer, scheduler, step, data position
    <output_dir>/checkpoints/step-00000040/rng-rank0.pt   each rank's RNG states (python, torch, cuda)
"""

import os
import random
import shutil

import torch

from . import distributed as dist_utils

PREFIX = "step-"


def _checkpoint_dir(output_dir: str) -> str:
    return os.path.join(output_dir, "checkpoints")


def _rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(output_dir: str, step: int, model, optimizer, scheduler, extra: dict, keep: int = 2) -> str:
    """Write checkpoint `step` (every rank calls this; rank 0 writes the shared state). Returns its path."""
    root = _checkpoint_dir(output_dir)
    final = os.path.join(root, f"{PREFIX}{step:08d}")
    tmp = os.path.join(root, f".tmp-{PREFIX}{step:08d}")
    if dist_utils.rank() == 0:
        os.makedirs(root, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # leftover of a run killed while saving
        os.makedirs(tmp)
    dist_utils.barrier()
    torch.save(_rng_state(), os.path.join(tmp, f"rng-rank{dist_utils.rank()}.pt"))
    if dist_utils.rank() == 0:
        state = {
            "step": step,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            **extra,
        }
        with open(os.path.join(tmp, "state.pt"), "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
    dist_utils.barrier()
    if dist_utils.rank() == 0:
        _fsync_dir(tmp)
        shutil.rmtree(final, ignore_errors=True)  # re-saving a step after a resume
        os.rename(tmp, final)
        _fsync_dir(root)
        for old in list_checkpoints(output_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    dist_utils.barrier()
    return final


def list_checkpoints(output_dir: str) -> list[str]:
    """Complete checkpoints, oldest first (temporary directories are never listed)."""
    root = _checkpoint_dir(output_dir)
    if not os.path.isdir(root):
        return []
    names = [n for n in os.listdir(root) if n.startswith(PREFIX) and n[len(PREFIX) :].isdigit()]
    return [os.path.join(root, n) for n in sorted(names, key=lambda n: int(n[len(PREFIX) :]))]


def latest_checkpoint(output_dir: str) -> str | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def load_checkpoint(path: str, model, optimizer, scheduler) -> dict:
    """Restore model, optimizer, scheduler and this rank's RNG; return the saved state's other fields."""
    state = torch.load(os.path.join(path, "state.pt"), map_location="cpu", weights_only=False)
    model.load_state_dict(state.pop("model"))
    optimizer.load_state_dict(state.pop("optimizer"))
    scheduler.load_state_dict(state.pop("scheduler"))
    rng_file = os.path.join(path, f"rng-rank{dist_utils.rank()}.pt")
    if os.path.exists(rng_file):
        _set_rng_state(torch.load(rng_file, weights_only=False))
    return state
