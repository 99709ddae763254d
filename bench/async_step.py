"""Synchronous vs asynchronous rollouts on vLLM's CPU build, and the step-time model checked against them.

Runs in the vLLM venv (`.ci/vllm.sh` builds it):

    HF_HUB_OFFLINE=1 PYTHONPATH=$PWD ~/.cache/fastrl/venv-vllm-*/bin/python -m bench.async_step [--steps 20]

Three runs of the tiny preset, the same number of steps each, each in a process of its own: the in-process
engine (synchronous), `--async-staleness 1`, and `--async-staleness 1 --rollout-chunk-tokens N`. The length mix
is heavy-tailed: `max_completion_length` is raised to `--cap`, and a seeded 1 in `--tail-every` prompts has all
its completions forced to the cap (min_tokens = max_tokens); the others end when the model ends them (a few
tokens). Both modes get the same per-prompt lengths: the rollout process through `AsyncRollout.submit`'s
per-group options, the in-process engine through its `VLLMEngine.lengths_of` hook.

Pinning: the synchronous run on core `--cores[0]`; the asynchronous runs' trainer there and the rollout process
on `--cores[1]` (`FASTRL_ROLLOUT_CPUS`), one torch thread each. Wall time: from step 1's record to the last's
(the engine's start-up and first batch excluded).

The synchronous run also carries a probe (the engine's steps: seconds, requests decoding, tokens prefilled; the
time in `generate` and in the weight sync; the natural completion lengths): `async_model.calibrate` turns it
into costs, and `async_model.simulate` predicts all three runs, the asynchronous ones from the synchronous
run alone. Printed: the measured table, the reward curves, the calibrated costs and the model check.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.async_model import Workload, calibrate, simulate, tail_prompt  # noqa: E402

TOLERANCE = 0.20  # the model's check: |predicted - measured| / measured


def lengths_of(cap: int, every: int, seed: int):
    """prompt id -> (max_tokens, min_tokens): the forced tail at the cap, the rest free to end early."""
    return lambda pid: (cap, cap) if tail_prompt(pid, every, seed) else (cap, 0)


def install_length_mix(limits) -> None:
    from fastrl.trainer.rollout.async_client import AsyncRollout
    from fastrl.trainer.rollout.vllm_engine import VLLMEngine

    VLLMEngine.lengths_of = staticmethod(limits)
    submit = AsyncRollout.submit

    def submit_with_lengths(self, prompt_id, prompt_ids, n, seed, **options):
        hi, lo = limits(prompt_id)
        return submit(self, prompt_id, prompt_ids, n, seed, **{"max_tokens": hi, "min_tokens": lo, **options})

    AsyncRollout.submit = submit_with_lengths


def install_probe(rec: dict, limits) -> None:
    """Record the in-process engine's steps, generate calls and weight syncs into `rec` (synchronous run)."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.llm_engine import LLMEngine

    from fastrl.trainer.rollout.vllm_engine import VLLMEngine

    rec.update(engine_steps=[], calls=[], push_s=[], lengths=[], prompt_lens=[])
    last = {}
    schedule, step, generate, sync = Scheduler.schedule, LLMEngine.step, VLLMEngine.generate, VLLMEngine.sync_weights

    def probed_schedule(self, *a, **k):
        out = schedule(self, *a, **k)
        decoding = sum(1 for n in out.num_scheduled_tokens.values() if n == 1)
        last["mix"] = (decoding, out.total_num_scheduled_tokens - decoding)
        rec["prompt_lens"] += [len(r.prompt_token_ids or ()) for r in out.scheduled_new_reqs]
        rec["limits"] = {"max_seqs": self.max_num_running_reqs, "max_batched_tokens": self.max_num_scheduled_tokens}
        return out

    def probed_step(self):
        t = time.perf_counter()
        out = step(self)
        mix = last.pop("mix", None)
        if mix is not None:
            rec["engine_steps"].append((time.perf_counter() - t, *mix))
        return out

    def probed_generate(self, prompts, n, want_logprobs=False, prompt_ids=None):
        t, first = time.perf_counter(), len(rec["engine_steps"])
        out = generate(self, prompts, n, want_logprobs, prompt_ids)
        engine_s = sum(s for s, _, _ in rec["engine_steps"][first:])
        tokens = sum(len(c.completion_ids) for c in out)
        rec["calls"].append({"generate_s": time.perf_counter() - t, "engine_s": engine_s, "requests": len(out),
                             "first_engine_step": first, "tokens": tokens})  # fmt: skip
        pids = [pid for pid in prompt_ids for _ in range(n)]
        rec["lengths"].append([len(c.completion_ids) for pid, c in zip(pids, out) if limits(pid)[1] == 0])
        return out

    def probed_sync(self, model):
        t = time.perf_counter()
        sync(self, model)
        rec["push_s"].append(time.perf_counter() - t)

    Scheduler.schedule, LLMEngine.step = probed_schedule, probed_step
    VLLMEngine.generate, VLLMEngine.sync_weights = probed_generate, probed_sync


def install_timers(rec: dict) -> None:
    """Time each optimizer step and each weight push into `rec` (both modes; the asynchronous push is `WeightPush`)."""
    from fastrl.trainer import trainer
    from fastrl.trainer.rollout.weight_push import WeightPush

    rec.update(update_s=[], async_push_s=[])

    def timed(fn, key):
        def run(*a, **k):
            t = time.perf_counter()
            out = fn(*a, **k)
            rec[key].append(time.perf_counter() - t)
            return out

        return run

    trainer.optimizer_step = timed(trainer.optimizer_step, "update_s")
    WeightPush.push = timed(WeightPush.push, "async_push_s")


def child(args) -> None:
    """One mode's run, pinned; its metrics (and the synchronous run's probe) written to `args.json`."""
    import torch

    from fastrl.trainer.config import make_config
    from fastrl.trainer.trainer import train

    core0, core1 = args.cores
    os.sched_setaffinity(0, {core0})
    torch.set_num_threads(1)
    limits = lengths_of(args.cap, args.tail_every, args.seed)
    install_length_mix(limits)
    flags, probe = {}, {}
    install_timers(probe)
    if args.child == "sync":
        install_probe(probe, limits)
    else:
        os.environ["FASTRL_ROLLOUT_CPUS"] = str(core1)
        flags["async_staleness"] = 1
        if args.child == "async-chunk":
            flags["rollout_chunk_tokens"] = args.chunk_tokens
    with tempfile.TemporaryDirectory(prefix="fastrl-async-bench-") as out:
        config = make_config("tiny", engine="vllm", vllm_enforce_eager=True, vllm_kv_cache_gib=0.25,
                             max_completion_length=args.cap, max_steps=args.steps, save_steps=0, progress=False,
                             seed=args.seed, output_dir=out, **flags)  # fmt: skip
        train(config)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
    with open(args.json, "w") as f:
        json.dump({"mode": args.child, "rows": rows, "probe": probe, "prompts_per_step": config.prompts_per_step,
                   "group_size": config.group_size}, f)  # fmt: skip


def measured(run: dict) -> dict:
    """Wall time from step 1's record to the last's, each side's idle fraction over it, staleness, drops."""
    rows, probe = run["rows"], run["probe"]
    wall = rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]
    if run["mode"] == "sync":  # the engine is busy inside its steps; the trainer idles inside generate
        gen_busy = sum(c["engine_s"] for c in probe["calls"][1:])
        trainer_wait = sum(c["generate_s"] for c in probe["calls"][1:])
    else:
        gen_busy = sum(r["generation_busy_s"] for r in rows[1:])
        trainer_wait = sum(r["trainer_wait_s"] for r in rows[1:])
    pushes = probe["push_s"][1:-1] if run["mode"] == "sync" else probe["async_push_s"][1:]
    return {"wall_s": wall, "generation_idle": 1 - gen_busy / wall, "trainer_idle": trainer_wait / wall,
            "update_ms_per_token": 1e3 * sum(probe["update_s"][1:]) / sum(r["train_tokens"] for r in rows[1:]),
            "push_s_mean": sum(pushes) / max(len(pushes), 1),
            "dropped": rows[-1].get("async_dropped_groups_total", 0.0),
            "staleness_mean": sum(r.get("staleness_mean", 0.0) for r in rows) / len(rows),
            "reward": [round(r["reward_correct_mean"], 3) for r in rows]}  # fmt: skip


def model_inputs(sync: dict, args):
    """(Costs, Workload) from the synchronous run only: its probe over steps 2..N and its metrics."""
    rows, probe = sync["rows"], sync["probe"]
    P, G = sync["prompts_per_step"], sync["group_size"]
    calls = probe["calls"][1:]
    # per step 2..N: its generate call, its optimizer step, the weight sync before it (after step i - 1), and the
    # rest of the trainer's time between the two records (scoring, advantages, logging): "other_s"
    steps = []
    for i in range(1, len(rows)):
        c, u, p = probe["calls"][i], probe["update_s"][i], probe["push_s"][i]
        gap = rows[i]["elapsed_s"] - rows[i - 1]["elapsed_s"]
        steps.append({"generate_s": c["generate_s"], "update_s": u, "completion_tokens": c["tokens"], "push_s": p,
                      "other_s": gap - c["generate_s"] - u - p})  # fmt: skip
    engine_steps = probe["engine_steps"][calls[0]["first_engine_step"] :]
    costs = calibrate(engine_steps, calls, steps, **probe["limits"])
    lengths = tuple(n for ls in probe["lengths"] for n in ls) or (args.cap,)
    prompt_len = round(sum(probe["prompt_lens"]) / len(probe["prompt_lens"]))
    work = Workload(P, G, prompt_len, args.cap, lengths, args.tail_every, args.seed)
    return costs, work


MODES = {"sync": (None, 0), "async-1": (1, 0), "async-chunk": (1, None)}


def report(runs: dict, args) -> dict:
    meas = {m: measured(r) for m, r in runs.items()}
    print(f"| mode | steps 2-{args.steps} wall s | generation idle | trainer idle | dropped groups | staleness mean "
          "| update ms / token | push s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for m, x in meas.items():
        print(f"| {m} | {x['wall_s']:.1f} | {x['generation_idle']:.2f} | {x['trainer_idle']:.2f} | "
              f"{x['dropped']:.0f} | {x['staleness_mean']:.2f} | {x['update_ms_per_token']:.3f} | "
              f"{x['push_s_mean']:.3f} |")  # fmt: skip
    for m, x in meas.items():
        print(f"{m} reward_correct_mean per step: {x['reward']}")
    out = {"measured": meas}
    if "sync" not in runs:
        return out
    costs, work = model_inputs(runs["sync"], args)
    print(f"calibrated on the synchronous run: {costs}")
    print(
        f"workload: P={work.prompts_per_step} G={work.group_size} prompt_len={work.prompt_len} cap={work.cap} "
        f"natural length mean {sum(work.lengths) / len(work.lengths):.1f}, 1 in {work.tail_every} at the cap"
    )
    print("| mode | measured wall s | predicted wall s | error | verdict | idle (generation, trainer): measured "
          "/ predicted | dropped groups: measured / predicted | staleness mean: measured / predicted |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    out.update(costs=costs.__dict__, predicted={})
    for m, x in meas.items():
        K, chunk = MODES[m]
        pred = simulate(costs, work, args.steps, K, args.chunk_tokens if chunk is None else chunk).window()
        err = (pred["wall_s"] - x["wall_s"]) / x["wall_s"]
        verdict = "calibration" if m == "sync" else ("PASS" if abs(err) <= TOLERANCE else "FAIL")
        print(f"| {m} | {x['wall_s']:.1f} | {pred['wall_s']:.1f} | {err:+.1%} | {verdict} | "
              f"{x['generation_idle']:.2f}, {x['trainer_idle']:.2f} / {pred['generation_idle']:.2f}, "
              f"{pred['trainer_idle']:.2f} | {x['dropped']:.0f} / {pred['dropped']} | "
              f"{x['staleness_mean']:.2f} / {pred['staleness_mean']:.2f} |")  # fmt: skip
        out["predicted"][m] = {**pred, "error": err, "verdict": verdict}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--cap", type=int, default=96, help="max_completion_length; the forced tail's length")
    ap.add_argument("--tail-every", type=int, default=8, help="1 in this many prompts forced to the cap")
    ap.add_argument("--chunk-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cores", type=int, nargs=2, default=(0, 1))
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--json", help="where to write the results (a mode's, with --child)")
    ap.add_argument("--from-json", help="report on the runs of an earlier --json instead of running")
    ap.add_argument("--child", choices=list(MODES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < 3:
        ap.error(f"--steps must be >= 3 (step 1 is excluded from the wall time), got {args.steps}")
    if args.child:
        return child(args)
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        runs = saved["runs"]
        for key in ("steps", "cap", "tail_every", "chunk_tokens", "seed"):  # the settings the runs were made with
            setattr(args, key, saved["args"][key])
    else:
        runs = {}
        with tempfile.TemporaryDirectory(prefix="fastrl-async-bench-") as tmp:
            for m in args.modes:
                path = os.path.join(tmp, f"{m}.json")
                cmd = [sys.executable, "-m", "bench.async_step", "--child", m, "--json", path, "--steps",
                       str(args.steps), "--cap", str(args.cap), "--tail-every", str(args.tail_every),
                       "--chunk-tokens", str(args.chunk_tokens), "--seed", str(args.seed), "--cores",
                       *map(str, args.cores)]  # fmt: skip
                t = time.time()
                subprocess.run(cmd, check=True, timeout=3600)
                print(f"{m}: {time.time() - t:.0f} s with the engine's start-up", file=sys.stderr, flush=True)
                with open(path) as f:
                    runs[m] = json.load(f)
    result = report(runs, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, **result}, f)


if __name__ == "__main__":
    main()
