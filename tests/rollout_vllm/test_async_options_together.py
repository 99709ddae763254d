"""Asynchronous rollouts with bounded staleness and every option at once: `--async-staleness 2` with partial rollouts
(4-token pieces), data parallel 2 × sequence parallel 2 × FSDP on 4 gloo ranks (torchrun), two optimizer steps per
admitted batch, gradient checkpointing, a KL term (beta > 0) and the IS correction (is_cap), for six steps.

Which version sampled each group depends on timing, so the reference trains on the launch's own groups: rank 0
records every group it takes from the rollout process (ids, behaviour log-probs, version spans, in its order,
`async_launch.py`); one process, without sequence parallelism, FSDP or a second replica, then runs the same
asynchronous loop on them (a stand-in for the rollout process hands them out in that order and checks each was
asked for, with the same prompt) from the same initial weights. Every step's loss, entropy, gradient norm, KL,
ratio, reward, tokens and staleness must equal the reference's to 1e-5 relative.

The pieces are checked against the weights themselves: the reference keeps the weights of every version it
pushes, and each token's behaviour log-prob must be its log-prob under the version that sampled it (a piece is
prefilled under its first token's version; tokens after a weight update inside a piece attend to keys computed by
the older weights, so they are left out).

`FASTRL_PLANT=<name>` runs the launch with the bug `async_launch.PLANTS[name]` and the test then asserts that the
launch fails, differs from the reference, or gives log-probs of other versions.
"""

import os
import subprocess
import sys

import pytest
import torch
from async_launch import CHUNK, WORLD, config
from async_replay import behaviour_gap, replay_reference
from vllm_reference import TOL

from fastrl.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow
STEPS = 6
KEYS = ("loss", "entropy_mean", "grad_norm", "kl_mean", "ratio_mean", "clip_frac_high", "reward_mean",
        "train_tokens", "staleness_mean", "staleness_max", "async_dropped_groups")  # fmt: skip
PLANT = os.environ.get("FASTRL_PLANT")  # one of async_launch.PLANTS


def launch(out_dir) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--standalone",
           os.path.join(os.path.dirname(os.path.abspath(__file__)), "async_launch.py"), str(out_dir)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=900)


def mismatches(got: list[dict], ref: list[dict]) -> list[str]:
    bad = [f"steps {[r['step'] for r in got]}"] if [r["step"] for r in got] != list(range(1, STEPS + 1)) else []
    for g, r in zip(got, ref):
        for k in KEYS:
            if g[k] != pytest.approx(r[k], rel=1e-5, abs=1e-6):
                bad.append(f"step {r['step']} {k}: {g[k]} != {r[k]}")
        if g["trained_prompt_ids"] != r["trained_prompt_ids"]:
            bad.append(f"step {r['step']} prompts {g['trained_prompt_ids']} != {r['trained_prompt_ids']}")
    return bad


@pytest.mark.timeout(1500)
def test_async_every_option_takes_the_one_process_steps(tmp_path):
    run = launch(tmp_path)
    if PLANT is not None and run.returncode != 0:
        print(f"the {PLANT!r} bug stopped the launch: {run.stdout[-1500:]}")
        return
    assert run.returncode == 0, run.stdout[-5000:]
    taken = torch.load(tmp_path / "groups.pt", weights_only=False)
    torch.set_num_threads(1)
    ref, weights = replay_reference(config(tmp_path / "reference"), taken)
    got = read_metrics(str(tmp_path / "launch"))
    bad = mismatches(got, ref)
    gap, checked, crossed = behaviour_gap(taken, weights, config("unused"), CHUNK)
    print(
        f"{len(taken)} groups taken; behaviour log-probs of {checked} tokens within {gap:.2e} of their version's; "
        f"{crossed} pieces crossed a version; staleness_mean {[round(r['staleness_mean'], 3) for r in got]}"
    )
    if gap > TOL:
        bad.append(f"behaviour log-probs {gap:.2e} off their version's")
    if PLANT is not None:
        print(f"the {PLANT!r} bug: {len(bad)} differences, {bad[:4]}")
        assert bad, f"the launch with the {PLANT!r} bug planted equals the reference"
        return
    assert not bad, bad
    # every option did something the comparison can see
    assert all(r["loss"] != 0 and r["grad_norm"] > 0 for r in ref)
    assert all(r["kl_mean"] > 0 for r in ref[1:])  # the policy moved away from the reference model
    assert max(r["staleness_max"] for r in ref) >= 1  # trained on tokens of an older version
    assert any(abs(r["ratio_mean"] - 1) > 1e-6 for r in ref)  # the ratio against the behaviour policy
    pieces = [n for g in taken for n in g.meta["pieces"]]
    assert max(pieces) > 1 and checked > 0.5 * sum(len(ids) for g in taken for ids in g.completion_ids)
