"""Synchronous vs asynchronous rollouts on vLLM's CPU build: the tiny preset, the same number of steps each.

Runs in the vLLM venv (`.ci/vllm.sh` builds it):

    HF_HUB_OFFLINE=1 PYTHONPATH=$PWD ~/.cache/fastrl/venv-vllm-*/bin/python -m bench.async_step [--steps 20]

Modes: the in-process engine (synchronous), `--async-staleness 1`, and `--async-staleness 1
--rollout-chunk-tokens N`. Prints each mode's wall time (engine start-up excluded: the steps' own
`step_s`), each side's idle fraction, the dropped groups, the mean staleness and the reward curve. On the
2-core test machine both processes share the same two cores, so overlap buys little there: the numbers
show the machinery, not a GPU speed-up. The tiny model's completions are short (the length mix is the
task's own, not a forced heavy tail).
"""

import argparse
import json
import os
import tempfile

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from fastrl.trainer.config import make_config  # noqa: E402
from fastrl.trainer.trainer import train  # noqa: E402


def run_mode(name: str, steps: int, out: str, **flags) -> dict:
    config = make_config("tiny", engine="vllm", vllm_enforce_eager=True, max_steps=steps, save_steps=0,
                         progress=False, output_dir=os.path.join(out, name), **flags)  # fmt: skip
    train(config)
    with open(os.path.join(out, name, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    wall = sum(r["step_s"] for r in rows[1:])  # the first step also waits for the engine's start
    if "trainer_idle_frac" in rows[0]:
        gen_idle = sum(r["generation_idle_frac"] * r["step_s"] for r in rows[1:]) / wall
        train_idle = sum(r["trainer_idle_frac"] * r["step_s"] for r in rows[1:]) / wall
    else:  # synchronous: the engine idles while the trainer updates, the trainer while it generates
        gen_idle = 1 - sum(r["rollout_s"] for r in rows[1:]) / wall
        train_idle = 1 - gen_idle
    return {
        "mode": name,
        "wall_s": wall,
        "generation_idle": gen_idle,
        "trainer_idle": train_idle,
        "dropped": rows[-1].get("async_dropped_groups_total", 0.0),
        "staleness_mean": sum(r.get("staleness_mean", 0.0) for r in rows) / len(rows),
        "reward": [round(r["reward_correct_mean"], 3) for r in rows],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--chunk-tokens", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fastrl-async-bench-") as out:
        results = [
            run_mode("sync", args.steps, out),
            run_mode("async-1", args.steps, out, async_staleness=1),
            run_mode(
                f"async-1-chunk-{args.chunk_tokens}",
                args.steps,
                out,
                async_staleness=1,
                rollout_chunk_tokens=args.chunk_tokens,
            ),  # fmt: skip
        ]
    print(f"| mode | steps 2-{args.steps} wall s | generation idle | trainer idle | dropped | staleness mean |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['mode']} | {r['wall_s']:.1f} | {r['generation_idle']:.2f} | {r['trainer_idle']:.2f} | "
              f"{r['dropped']:.0f} | {r['staleness_mean']:.2f} |")  # fmt: skip
    for r in results:
        print(f"{r['mode']} reward_correct_mean per step: {r['reward']}")


if __name__ == "__main__":
    main()
