"""Atomic checkpoints: written to a temporary directory, then renamed into place.

A rename within one filesystem is atomic, so a kill at any moment leaves either the previous complete
checkpoint or the new complete one, never a half-written `step-N`. Layout:

    <output_dir>/checkpoints/step-00000040/state.pt       model, optimizer, scheduler, step, data position
    <output_dir>/checkpoints/step-00000040/rng-rank0.pt   each rank's RNG states (python, torch, cuda)
    <output_dir>/checkpoints/step-00000040/manifest.json  every other file's size in bytes and SHA-256

A resume checks the newest checkpoint against its manifest (and that it loads); a corrupt one (a disk that
filled up, a copy cut short) is named, renamed to `step-N.corrupt` and the next older intact one is used.
An output directory holding another run's checkpoints or metrics is refused unless the run resumes it or
overwrites it, so two runs never mix their logs and checkpoints.
"""

import hashlib
import json
import os
import random
import shutil
import sys

import torch

from . import distributed as dist_utils
from .validate import ConfigError

__all__ = [
    "checkpoint_dir",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "prepare_output_dir",
    "resume_checkpoint",
    "rng_state",
    "save_checkpoint",
    "save_state",
    "set_rng_state",
    "verify_checkpoint",
    "write_staged",
]

PREFIX = "step-"
MANIFEST = "manifest.json"
METRICS = "metrics.jsonl"


def checkpoint_dir(output_dir: str) -> str:
    return os.path.join(output_dir, "checkpoints")


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
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


def _digest(path: str) -> dict:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            sha.update(block)
    return {"bytes": os.path.getsize(path), "sha256": sha.hexdigest()}


def _write_manifest(directory: str, step: int) -> None:
    files = {n: _digest(os.path.join(directory, n)) for n in sorted(os.listdir(directory)) if n != MANIFEST}
    with open(os.path.join(directory, MANIFEST), "w", encoding="utf-8") as f:
        json.dump({"step": step, "files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _step_of(path: str) -> int:
    return int(os.path.basename(path)[len(PREFIX) :])


def save_state(directory: str, state: dict) -> None:
    """`state` as `directory/state.pt`, on disk (fsynced) when this returns."""
    with open(os.path.join(directory, "state.pt"), "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def write_staged(output_dir: str, step: int, keep: int, write, *, manifest: bool = True) -> str:
    """Write checkpoint `step` atomically (every rank calls this). Returns its path.

    Rank 0 creates `.tmp-step-N`; every rank saves its RNG states there and calls `write(tmp)` for its own
    files; once all are done, rank 0 adds the manifest (when `manifest`, last: a checkpoint without it was never
    completed), fsyncs the directory, renames it to `step-N`, and keeps the newest `keep` checkpoints up to
    this step (a newer one cannot belong to this run's history).
    """
    root = checkpoint_dir(output_dir)
    final = os.path.join(root, f"{PREFIX}{step:08d}")
    tmp = os.path.join(root, f".tmp-{PREFIX}{step:08d}")
    if dist_utils.rank() == 0:
        os.makedirs(root, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # leftover of a run killed while saving
        os.makedirs(tmp)
    dist_utils.barrier()
    torch.save(rng_state(), os.path.join(tmp, f"rng-rank{dist_utils.rank()}.pt"))
    write(tmp)
    dist_utils.barrier()
    if dist_utils.rank() == 0:
        if manifest:
            _write_manifest(tmp, step)
        _fsync_dir(tmp)
        shutil.rmtree(final, ignore_errors=True)  # re-saving a step after a resume
        os.rename(tmp, final)
        _fsync_dir(root)
        ours = [p for p in list_checkpoints(output_dir) if _step_of(p) <= step]
        for old in ours[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    dist_utils.barrier()
    return final


def save_checkpoint(output_dir: str, step: int, model, optimizer, scheduler, extra: dict, keep: int = 2) -> str:
    """Write checkpoint `step` (every rank calls this; rank 0 writes the shared state). Returns its path."""

    def write(tmp: str) -> None:
        if dist_utils.rank() == 0:
            state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "scheduler": scheduler.state_dict(), **extra}  # fmt: skip
            save_state(tmp, state)

    return write_staged(output_dir, step, keep, write)


def list_checkpoints(output_dir: str) -> list[str]:
    """Complete checkpoints, oldest first (temporary directories are never listed)."""
    root = checkpoint_dir(output_dir)
    if not os.path.isdir(root):
        return []
    names = [n for n in os.listdir(root) if n.startswith(PREFIX) and n[len(PREFIX) :].isdigit()]
    return [os.path.join(root, n) for n in sorted(names, key=lambda n: int(n[len(PREFIX) :]))]


def latest_checkpoint(output_dir: str) -> str | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def verify_checkpoint(path: str) -> str | None:
    """None if the checkpoint matches its manifest; else what is wrong, naming the file.

    A checkpoint written before manifests existed has none: only loading it can tell.
    """
    manifest = os.path.join(path, MANIFEST)
    try:
        with open(manifest, encoding="utf-8") as f:
            files = json.load(f)["files"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{manifest} is unreadable ({type(e).__name__})"
    for name, want in files.items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            return f"{file} is missing"
        size = os.path.getsize(file)
        if size != want["bytes"]:
            return f"{file} has {size} bytes, the manifest says {want['bytes']}"
        if _digest(file)["sha256"] != want["sha256"]:
            return f"{file} does not match its SHA-256 in the manifest"
    return None


def _read(path: str, name: str, **kw):
    file = os.path.join(path, name)
    try:
        return torch.load(file, weights_only=False, **kw)
    except Exception as e:  # a torn zip, a truncated pickle: name the file, not torch's internals
        raise ConfigError("resume", True, f"{file} cannot be loaded ({type(e).__name__}: {e})") from None


def load_checkpoint(path: str, model, optimizer, scheduler) -> dict:
    """Restore model, optimizer, scheduler and this rank's RNG; return the saved state's other fields."""
    state = _read(path, "state.pt", map_location="cpu")
    rng_name = f"rng-rank{dist_utils.rank()}.pt"
    rng = _read(path, rng_name) if os.path.exists(os.path.join(path, rng_name)) else None
    model.load_state_dict(state.pop("model"))
    optimizer.load_state_dict(state.pop("optimizer"))
    scheduler.load_state_dict(state.pop("scheduler"))
    if rng is not None:
        set_rng_state(rng)
    return state


def resume_checkpoint(output_dir: str, model, optimizer, scheduler) -> tuple[str | None, dict | None]:
    """Load the newest intact checkpoint: (path, state), or (None, None) when there is none at all.

    A corrupt checkpoint is reported on stderr, renamed to `<name>.corrupt` (so it is never listed, loaded
    or counted again) and the next older one is tried. Raises ConfigError when every one is corrupt.
    """
    found = list_checkpoints(output_dir)
    bad = []
    for path in reversed(found):
        problem = verify_checkpoint(path)
        if problem is None:
            try:
                state = load_checkpoint(path, model, optimizer, scheduler)
            except ConfigError as e:
                problem = e.reason
        if problem is None:
            if bad and dist_utils.rank() == 0:
                print(f"fastrl: resuming from {path} instead", file=sys.stderr, flush=True)
            _quarantine(bad)
            return path, state
        bad.append(path)
        if dist_utils.rank() == 0:
            print(f"fastrl: checkpoint {path} is corrupt: {problem}; falling back to an older one",
                  file=sys.stderr, flush=True)  # fmt: skip
    if found:
        raise ConfigError("resume", True, f"no intact checkpoint in {checkpoint_dir(output_dir)}")
    return None, None


def _quarantine(paths: list[str]) -> None:
    dist_utils.barrier()  # every rank has read what it needs
    if dist_utils.rank() == 0:
        for path in paths:
            shutil.rmtree(path + ".corrupt", ignore_errors=True)
            os.replace(path, path + ".corrupt")
    dist_utils.barrier()


def prepare_output_dir(output_dir: str, resume: bool, overwrite: bool) -> None:
    """Refuse a directory holding another run unless resuming it; with `overwrite`, delete that run first."""
    ckpts, metrics = list_checkpoints(output_dir), os.path.join(output_dir, METRICS)
    if resume or not (ckpts or os.path.exists(metrics)):
        return
    if not overwrite:
        held = f"{len(ckpts)} checkpoint(s)" if ckpts else "a metrics.jsonl"
        raise ConfigError(
            "output_dir", output_dir, f"holds another run ({held}): pass --resume to continue it or --overwrite "
            "to delete it and start again",
        )  # fmt: skip
    if int(os.environ.get("RANK", "0")) == 0:
        shutil.rmtree(checkpoint_dir(output_dir), ignore_errors=True)
        shutil.rmtree(os.path.join(output_dir, "tensorboard"), ignore_errors=True)
        if os.path.exists(metrics):
            os.remove(metrics)
