"""`fastrl train --async-staleness K` on vLLM's CPU build: the synchronous order at K = 0 (with a thinking budget),
learning at K = 1 with partial rollouts and replayed kept sets, a killed rollout process reported, and a resume that
trains every prompt exactly once."""

import gc
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from async_replay import behaviour_gap, replay_reference
from vllm_reference import ENGINE, TOL, alive

from fastrl.trainer import scoring
from fastrl.trainer import trainer as loop
from fastrl.trainer.config import make_config
from fastrl.trainer.metrics import read_metrics
from fastrl.trainer.tiny.model import CharTokenizer

pytestmark = pytest.mark.slow
CHUNK = 3  # the sequence-parallel run's partial rollouts: tokens a piece
TIMING = {"rollout_s", "step_s", "tokens_per_s", "elapsed_s", "total_wall_s", "eval_time_s"}


def rows_of(out) -> list[dict]:
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_staleness_zero_samples_and_logs_as_the_synchronous_trainer(tmp_path, monkeypatch):
    """K = 0 in one process and on 2 gloo ranks (rank 0 owns the rollout process and deals the groups) against
    the synchronous one-process run: the same samples, metrics and prompts, with two optimizer steps per batch
    (each a version pushed to the rollout process; the second step's ratio against the batch's frozen log-probs).
    The 2 ranks as one sequence-parallel group with FSDP, with partial rollouts (3-token pieces, each a request with a
    seed of its own, so the synchronous run's one request a completion is no reference for their tokens) and a KL term
    against the frozen reference (beta > 0), take the steps of one process on the same groups (rank 0 records them,
    `async_replay.py`), every token's behaviour log-prob the batch version's.

    Every run has a thinking budget of 2 tokens (the warmed-up tiny model opens the span itself and thinks for 3 or
    more), applied by the rollout process as by the synchronous engine: the same completions, inserted spans (masked
    out of the loss) and losses.

    Every run evaluates every 2 steps (greedy, 16 trained problems): the synchronous run on its vLLM engine, the
    asynchronous ones in the trainer process (transformers' generate on the current weights), the 2 ranks each its
    shard, gathered: the same eval columns on steps 2 and 4. And every run checkpoints its activations and caps the
    rollout IS weight (is_cap, the sampler's log-probs)."""
    common = dict(ENGINE, max_steps=4, prompts_per_step=4, group_size=4, minibatches=2, warmup_sft_steps=60,
                  save_steps=0, progress=False, thinking_budget=2, thinking_stop_text=".",
                  eval_dataset="arithmetic-trained", eval_every=2, eval_max_problems=16, gradient_checkpointing=True,
                  is_cap=2.0)  # fmt: skip
    flags = ("--async-staleness", "0", "--max-steps", "4", "--minibatches", "2", "--thinking-budget", "2",
             "--thinking-stop-text", ".", "--eval-dataset", "arithmetic-trained", "--eval-every", "2",
             "--eval-max-problems", "16", "--gradient-checkpointing", "--is-cap", "2.0")  # fmt: skip
    seen, to_samples = [], scoring.to_samples

    def recorded(comps, *args, **kwargs):  # each run's completions, inserted spans and loss masks, in batch order
        samples = to_samples(comps, *args, **kwargs)
        seen[-1] += [(c.completion_ids, c.inserted, s.token_mask) for c, s in zip(comps, samples)]
        return samples

    monkeypatch.setattr(scoring, "to_samples", recorded)
    two_ranks, sp_ranks = _start_two_ranks(tmp_path / "async-2", *flags), None
    try:
        seen.append([])
        loop.train(make_config("tiny", output_dir=str(tmp_path / "sync"), **common))
        gc.collect()  # the in-process engine goes before the rollout process starts
        seen.append([])
        loop.train(make_config("tiny", output_dir=str(tmp_path / "async"), async_staleness=0, **common))
        # the same completions, inserted spans and loss masks: two batches of 4 prompts x 4 completions
        assert len(seen[0]) == 2 * 4 * 4 and seen[1] == seen[0]
        assert all(len(spans) <= 1 for _, spans, _ in seen[0])  # at most one span a completion: the budget's
        cut = [(ids, spans[0], mask) for ids, spans, mask in seen[0] if spans]
        insert = CharTokenizer().encode(".</think>")  # the stop-thinking text and the closing marker
        assert len(cut) >= len(seen[0]) // 2 and all(span.kind == "thinking" for _, span, _ in cut), cut
        assert all(ids[span.start : span.end] == insert for ids, span, _ in cut), cut
        assert all(mask[span.start : span.end] == [0.0, 0.0] and sum(mask) == len(ids) - 2 for ids, span, mask in cut)
        log = two_ranks.communicate(timeout=900)[0]
        assert two_ranks.returncode == 0, log[-3000:]
        # the two ranks as one sequence-parallel group (both train the whole batch, each its block of the tokens),
        # the weights sharded over them: every rank takes part in each push, rank 0 sends
        sp_ranks = _start_two_ranks(tmp_path / "async-sp", *flags, "--sequence-parallel", "2", "--fsdp",
                                    "--rollout-chunk-tokens", str(CHUNK), "--beta", "0.05",
                                    record=tmp_path / "sp")  # fmt: skip
        log = sp_ranks.communicate(timeout=900)[0]
        assert sp_ranks.returncode == 0, log[-3000:]
    finally:
        for proc in (two_ranks, sp_ranks):
            if proc is not None:
                proc.kill()
    sync, asyn, asyn2 = rows_of(tmp_path / "sync"), rows_of(tmp_path / "async"), rows_of(tmp_path / "async-2")
    assert len(sync) == len(asyn) == len(asyn2) == 4
    assert all(r["thinking_budget_cut_frac"] > 0 for r in sync)
    assert [r["step"] for r in sync if "eval_pass@1" in r] == [2, 4]
    assert all(r["eval_version"] == r["step"] for r in asyn + asyn2 if "eval_version" in r)
    assert all(abs(r["ratio_mean"] - 1) > 1e-7 for r in sync[1::2])  # the second steps train against old log-probs
    for a, b, c in zip(sync, asyn, asyn2):
        for key in sorted(set(a) - TIMING):
            assert abs(a[key] - b[key]) <= 1e-6, (a["step"], key, a[key], b[key])
            assert abs(a[key] - c[key]) <= 1e-6, ("2 ranks", a["step"], key, a[key], c[key])
        assert b["staleness_max"] == c["staleness_max"] == 0 and b["async_dropped_groups"] == 0
        assert "rank_prompt_ids" not in b
    keys = (
        "loss",
        "entropy_mean",
        "reward_mean",
        "train_tokens",
        "grad_norm",
        "ratio_mean",
        "clip_frac_high",
        "kl_mean",
    )
    sp, taken = rows_of(tmp_path / "async-sp"), torch.load(tmp_path / "sp" / "groups.pt", weights_only=False)
    one = make_config("tiny", output_dir=str(tmp_path / "sp-reference"), async_staleness=0, rollout_chunk_tokens=CHUNK,
                      beta=0.05, **common)  # fmt: skip
    t = time.monotonic()
    seen.append([])
    ref, weights = replay_reference(one, taken)
    torch.testing.assert_close([[r[k] for k in keys] for r in sp], [[r[k] for k in keys] for r in ref], rtol=1e-5,
                               atol=1e-6)  # fmt: skip
    gap, checked, _ = behaviour_gap(taken, weights, one, CHUNK)
    pieces = [n for g in taken for n in g.meta["pieces"]]
    print(f"K = 0, {CHUNK}-token pieces: {max(pieces)} pieces at most; behaviour log-probs of {checked} tokens "
          f"within {gap:.2e} of the batch version's; reference and check {time.monotonic() - t:.1f} s")  # fmt: skip
    assert gap <= TOL and checked > 0.5 * sum(len(ids) for g in taken for ids in g.completion_ids)
    assert all(r["staleness_max"] == 0 for r in sp) and all(r["kl_mean"] > 0 for r in ref[1:])  # beta's term is on
    # a piece samples at most CHUNK tokens (the inserted ones are not sampled): the completions were cut into pieces
    sampled = [(len(ids) - sum(s.end - s.start for s in spans), n)
               for g in taken for ids, spans, n in zip(g.completion_ids, g.inserted, g.meta["pieces"])]  # fmt: skip
    assert all(n >= -(-k // CHUNK) for k, n in sampled) and max(k for k, _ in sampled) > CHUNK, sampled
    steps = [[0, 1, 2, 3], [0, 1, 2, 3], [4, 5, 6, 7], [4, 5, 6, 7]]  # each batch's prompts on both its steps
    assert [r["trained_prompt_ids"] for r in asyn] == [r["trained_prompt_ids"] for r in asyn2] == steps
    # each rank trained on its own contiguous half of the step's prompts, none on another's
    assert [r["rank_prompt_ids"] for r in asyn2] == [[s[:2], s[2:]] for s in steps]


def _start_two_ranks(out, *flags, record=None):
    """`fastrl train` on 2 gloo ranks under torchrun, the tiny preset on the vLLM engine; with `record`, rank 0's
    groups saved in that folder (`async_launch.py`)."""
    run = ["-m", "fastrl.trainer"] if record is None else [os.path.join(os.path.dirname(__file__), "async_launch.py"),
                                                           str(record)]  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone", *run, "train",
           "--preset", "tiny", "--engine", "vllm", "--vllm-enforce-eager",
           "--vllm-kv-cache-gib", "0.25", "--output-dir", str(out), "--prompts-per-step", "4", "--group-size", "4",
           "--warmup-sft-steps", "60", "--save-steps", "0", "--no-progress", *flags]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def test_async_run_learns_with_bounded_staleness_and_partial_rollouts(tmp_path):
    """One 40-step run: K = 1 with 4-token chunks (completions are up to 12 tokens), top-p 0.9 with the kept sets
    the rollout process recorded replayed by the loss (every sampled token inside its set)."""
    steps, out = 40, tmp_path / "run"
    config = make_config("tiny", **ENGINE, max_steps=steps, save_steps=0, progress=False, output_dir=str(out),
                         async_staleness=1, rollout_chunk_tokens=4, top_p=0.9, sampler_replay="on")  # fmt: skip
    loop.train(config)
    rows = rows_of(out)
    acc = [r["reward_correct_mean"] for r in rows]
    first, final = sum(acc[:10]) / 10, sum(acc[-10:]) / 10
    stale = [r["staleness_mean"] for r in rows]
    busy = [(r["generation_busy_frac"], r["trainer_busy_frac"]) for r in rows[1:]]
    print(f"async tiny run: reward_correct_mean {first:.3f} -> {final:.3f}; staleness_mean {sum(stale) / steps:.3f}; "
          f"dropped {rows[-1]['async_dropped_groups_total']:.0f}; mean busy (generation, trainer) "
          f"{sum(g for g, _ in busy) / len(busy):.2f}, {sum(t for _, t in busy) / len(busy):.2f}")  # fmt: skip
    assert len(rows) == steps and final - first >= 0.3, acc
    # tokens trained one version after they were sampled: the rollouts ran ahead of the trainer (the busy fractions
    # above are timings, printed, not asserted: they depend on the machine's load)
    assert max(r["staleness_max"] for r in rows) <= 1 and sum(stale) > 0
    assert sum(r["replay_missing_tokens"] for r in rows) == 0


def _run(out, *flags):
    cmd = [sys.executable, "-m", "fastrl.trainer", "train", "--preset", "tiny", "--engine", "vllm",
           "--vllm-enforce-eager", "--output-dir", str(out), "--async-staleness", "1", "--prompts-per-step", "4",
           "--group-size", "4", "--warmup-sft-steps", "60", "--save-steps", "2", "--max-steps", "8", "--no-progress",
           *flags]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _worker_of(pid: int) -> int | None:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        kids = [int(k) for k in f.read().split()]
    for k in kids:
        with open(f"/proc/{k}/cmdline", "rb") as f:
            if b"spawn_main" in f.read():  # not the resource tracker
                return k
    return None


def _wait_step(trainer, out, step: int) -> None:
    """Until the log's last line is step `step` or later. The log is read as the trainer reads it (a line torn by
    a kill is skipped); a resumed run cuts it back to its checkpoint only once its model is loaded, so the steps
    the killed run logged are still there for a while."""
    deadline = time.monotonic() + 900
    while not (os.path.exists(out / "metrics.jsonl") and (rows := read_metrics(out)) and rows[-1]["step"] >= step):
        assert trainer.poll() is None and time.monotonic() < deadline, trainer.stdout.read()
        time.sleep(0.5)


def test_killed_rollout_process_is_reported_and_resume_trains_each_prompt_once(tmp_path):
    """The rollout process SIGKILLed mid-step (reported, the run stops), a resume, the whole run SIGKILLed mid-step
    (its rollout process dies with it), a second resume: every prompt trained on exactly once."""
    out = tmp_path / "run"
    trainer = _run(out, "--rollout-timeout-s", "300")
    _wait_step(trainer, out, 3)  # past the step-2 checkpoint
    worker = _worker_of(trainer.pid)
    os.kill(worker, signal.SIGKILL)  # mid-step: the rollout process dies
    t = time.monotonic()
    log = trainer.communicate(timeout=120)[0]
    assert trainer.returncode != 0 and "rollout worker" in log and "exited with code -9" in log, log[-3000:]
    print(f"killed rollout process reported after {time.monotonic() - t:.1f} s")
    # groups queued before the kill may have carried the killed run a step or two further: wait for a step past
    # those, which only the resumed run can have logged, and past the step-4 checkpoint
    killed_last = read_metrics(out)[-1]["step"]
    assert killed_last < 7, f"the killed run logged step {killed_last}: too late for a kill mid-run"
    print(f"the killed run logged steps through {killed_last}")
    resumed = _run(out, "--resume")
    try:
        _wait_step(resumed, out, max(5, killed_last + 1))
        worker = _worker_of(resumed.pid)
        assert worker is not None
        resumed.kill()  # the whole run, mid-step
        resumed.wait(30)
    finally:
        resumed.kill()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and alive(worker):
        time.sleep(0.1)
    assert not alive(worker), f"rollout worker {worker} outlived its SIGKILLed trainer"
    resumed = _run(out, "--resume")
    log = resumed.communicate(timeout=900)[0]
    assert resumed.returncode == 0, log[-3000:]
    rows = rows_of(out)
    assert [r["step"] for r in rows] == list(range(1, 9))
    trained = [i for r in rows for i in r["trained_prompt_ids"]]
    assert len(trained) == len(set(trained)) == 8 * 4  # each prompt trained on once
    state = torch.load(out / "checkpoints" / "step-00000008" / "state.pt", weights_only=False)["async_state"]
    pending = set(state["pending"])
    assert not pending & set(trained) and set(trained) | pending == set(range(state["next_id"]))  # none skipped
