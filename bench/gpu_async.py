"""A few asynchronous GRPO steps on one GPU, the rollout process colocated (part of `python -m bench.gpu`).

`fastrl.trainer.train` with `--async-staleness 1` on the tiny preset moved to CUDA with the vLLM engine: the rollout
process runs its own vLLM engine on the trainer's GPU (no `--rollout-gpus`), the weights going over vLLM's `ipc`
engine (`fastrl/trainer/rollout/ipc_weights.py`) after every optimizer step. Reports steps/s (the steps after the
first, which holds the engine's start), that the rewards and the loss, entropy and ratio (the log-probs behind
them) are finite, and that no token trained was more than one version stale. The `--rollout-gpus` case needs a GPU
for the trainer and one for the rollout process (two NCCL ranks cannot share a GPU): skipped here, said so.

`--dry-run` skips the part with its reason: the CPU path costs a vLLM engine start (about a minute) and runs in
tests/rollout_vllm/test_async_training.py.
"""

import importlib.util
import math
import tempfile
import time

STEPS = 6
TWO_GPUS = "the --rollout-gpus case (weights over NCCL to GPUs of the rollout process's own) needs two GPUs: skipped"


def missing(dry_run: bool) -> str | None:
    """Why the colocated async step cannot run here (None: it can)."""
    if dry_run:
        return ("dry run: the asynchronous step needs vLLM on CUDA; its CPU path starts a vLLM engine (about a minute) "
                "and is tested by tests/rollout_vllm/test_async_training.py")  # fmt: skip
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return "vLLM is not installed (pip install 'fastrl[vllm]')"
    return None


def main(dry_run: bool) -> dict:
    reason = missing(dry_run)
    if reason is not None:
        print(f"async: {reason}\nasync: {TWO_GPUS}", flush=True)
        return {"pass": dry_run, "skipped": reason, "table": f"skipped: {reason}\n\n{TWO_GPUS}"}
    from fastrl.trainer import trainer as loop
    from fastrl.trainer.config import make_config
    from fastrl.trainer.metrics import read_metrics

    with tempfile.TemporaryDirectory(prefix="fastrl-gpu-async-") as out:
        config = make_config("tiny", device="cuda", engine="vllm", async_staleness=1, max_steps=STEPS,
                             warmup_sft_steps=60, save_steps=0, plot=False, progress=False, output_dir=out,
                             vllm_enforce_eager=True)  # fmt: skip
        start = time.perf_counter()
        loop.train(config)
        wall = time.perf_counter() - start
        rows = read_metrics(out)
    later = rows[1:]  # the first step holds the rollout engine's start
    steps_per_s = len(later) / sum(r["step_s"] for r in later) if later else 0.0
    keys = ("reward_mean", "loss", "entropy_mean", "ratio_mean")
    finite = all(math.isfinite(r[k]) for r in rows for k in keys)
    stale = max((r["staleness_max"] for r in rows), default=float("nan"))
    ok = len(rows) == STEPS and finite and stale <= 1 and steps_per_s > 0
    table = (
        "| steps | steps/s (after the first) | wall s | rewards, loss, entropy, ratio finite | staleness_max |\n"
        "|---|---|---|---|---|\n"
        f"| {len(rows)} | {steps_per_s:.2f} | {wall:.1f} | {finite} | {stale:.0f} |\n\n{TWO_GPUS}"
    )
    return {"pass": ok, "steps": len(rows), "steps_per_s": steps_per_s, "wall_s": wall, "finite": finite,
            "staleness_max": stale, "rollout_gpus": "skipped: needs two GPUs", "table": table}  # fmt: skip
