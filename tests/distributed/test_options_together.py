"""Every synchronous option at once: data parallel 2 × sequence parallel 2 × FSDP on 4 gloo ranks, with the sampler's
kept sets replayed (top-k + top-p), a thinking budget, two optimizer steps per rollout batch, gradient checkpointing,
packing, a KL term (beta > 0) and the IS correction (is_cap), takes the steps of one replicated process.

The launch runs `trainer.train` on every rank for two steps (one rollout batch), saves, and resumes for two more.
Each rank records the completions its engine sampled; the reference is one process, without sequence parallelism or
FSDP, whose engine returns the two replicas' completions in rank order: the same global batch. Every step's loss,
entropy, gradient norm, KL, reward and token counts must equal the reference's to 1e-5 relative. Each option has a
bug in `PLANTS` that fails the launch: `FASTRL_PLANT=<name>` runs it monkeypatched into every rank, and the test then
asserts the difference from the reference (the sequence-parallel and checkpointing bugs stop the run before: a
target outside its kept set, layers left without gradients).
"""

import dataclasses
import os

import pytest
import torch
from _spawn import spawn

from fastrl.trainer import scoring, sources, trainer, update
from fastrl.trainer import sequence_parallel as seqpar
from fastrl.trainer.batching import KeptSets
from fastrl.trainer.config import make_config
from fastrl.trainer.metrics import read_metrics

OPTIONS = dict(
    engine="hf", warmup_sft_steps=5, prompts_per_step=4, group_size=4, length_penalty=1.0,
    top_k=6, top_p=0.9, sampler_replay="on",  # replay
    thinking_budget=2, thinking_stop_text=" stop.", prompt_template="{prompt}<think>", min_completion_length=5,
    minibatches=2, gradient_checkpointing=True, packing="on", beta=0.05, is_cap=2.0,
    progress=False, plot=False, log_every=0,
)  # fmt: skip
LAUNCH = dict(sequence_parallel=2, fsdp=True)  # on 4 ranks: 2 data-parallel replicas
WORLD, STEPS = 4, 4  # the first run takes steps 1-2 and saves; the resumed one steps 3-4
KEYS = ("loss", "entropy_mean", "grad_norm", "kl_mean", "reward_mean", "train_tokens", "replay_missing_tokens",
        "thinking_budget_cut_frac", "response_length_mean")  # fmt: skip


def config(out, **more):
    return make_config("tiny", **{"output_dir": str(out), "max_steps": STEPS, **OPTIONS, **more})


class Recorded:
    """An engine that saves every batch it samples (the launch) or returns the saved ones in order (the reference)."""

    def __init__(self, engine, path, replay: list | None = None):
        self.engine, self.path, self.replay = engine, path, replay

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompts, n, **kwargs):
        if self.replay is not None:
            comps = self.replay.pop(0)
            assert [c.prompt_ids for c in comps[::n]] == prompts, "the reference asks for other prompts"
            return comps
        comps = self.engine.generate(prompts, n, **kwargs)
        calls = torch.load(self.path, weights_only=False) if os.path.exists(self.path) else []
        torch.save(calls + [comps], self.path)
        return comps


def _record_rollouts(mp, path):
    real = sources.make_engine
    mp.setattr(sources, "make_engine", lambda *args: Recorded(real(*args), path))


# --- the plants: one bug per option, each must make the launch differ from the reference ---


def _sequence_parallel(mp):  # each block's labels shifted inside the block, not across blocks
    real = seqpar._shard_labels

    def planted(input_ids, sp, block):
        ids, _ = real(input_ids, sp, block)
        return ids, ids.roll(-1, 1)

    mp.setattr(seqpar, "_shard_labels", planted)


def _data_parallel(mp):  # the data-parallel groups built from the sequence groups' ranks
    real = seqpar.group_ranks
    mp.setattr(seqpar, "group_ranks", lambda world, size: (real(world, size)[0], real(world, size)[0]))


def _fsdp(mp):  # the shards' gradients averaged over the ranks instead of summed
    from torch.distributed.fsdp import FSDPModule

    mp.setattr(FSDPModule, "set_gradient_divide_factor", lambda self, factor: None)


def _replay(mp):  # each token scored with the next token's kept set
    real = scoring.to_samples

    def planted(*args):
        samples = real(*args)
        for s in samples:
            starts = [0] + s.kept.counts.cumsum(0).tolist()
            sets = [s.kept.ids[a:b].tolist() for a, b in zip(starts, starts[1:])]
            s.kept = KeptSets.of(sets[1:] + sets[:1])
        return samples

    mp.setattr(scoring, "to_samples", planted)


def _thinking_budget(mp):  # the inserted tokens trained on as if sampled
    mp.setattr(scoring, "sampled_mask", lambda completion: None)


def _steps(mp):  # the batch's log-probs not frozen: every step's ratio is 1
    real = sources.attach_logprobs
    mp.setattr(sources, "attach_logprobs", lambda run, samples, old: real(run, samples, False))


def _checkpointing(mp):  # the recomputed layers cut off from the layers below them
    from fastrl.trainer import build

    real = build.enable_checkpointing

    def planted(model):
        real(model)
        for module in model.modules():
            if getattr(module, "gradient_checkpointing", False):
                inner = module._gradient_checkpointing_func
                module._gradient_checkpointing_func = lambda fn, *args, inner=inner: inner(
                    fn, *(a.detach() if torch.is_tensor(a) else a for a in args)
                )

    mp.setattr(build, "enable_checkpointing", planted)


def _packing(mp):  # positions that run on across the packed documents
    real = update.collate

    def planted(seqs, packed, pad_id):
        mb = real(seqs, packed, pad_id)
        if packed:
            mb["position_ids"] = torch.arange(mb["input_ids"].shape[1]).view(1, -1)
        return mb

    mp.setattr(update, "collate", planted)


def _beta(mp):  # the KL term left out of the loss
    real = update.grpo_loss
    mp.setattr(update, "grpo_loss", lambda *a, config, **kw: real(*a, config=dataclasses.replace(config, beta=0.0),
                                                                   **kw))  # fmt: skip


def _is_cap(mp):  # the sampler's log-probs one token out of place
    real = scoring.to_samples

    def planted(*args):
        samples = real(*args)
        for s in samples:
            s.rollout_logprobs = s.rollout_logprobs[1:] + s.rollout_logprobs[:1]
        return samples

    mp.setattr(scoring, "to_samples", planted)


PLANTS = {
    "sequence parallel": _sequence_parallel,
    "data parallel": _data_parallel,
    "fsdp": _fsdp,
    "replay": _replay,
    "thinking budget": _thinking_budget,
    "steps": _steps,
    "checkpointing": _checkpointing,
    "packing": _packing,
    "beta": _beta,
    "is_cap": _is_cap,
}
PLANT = os.environ.get("FASTRL_PLANT")  # one of PLANTS: the launch runs with it and must then differ


def _worker(rank, world, out_dir, plant):
    with pytest.MonkeyPatch.context() as mp:
        if plant is not None:
            PLANTS[plant](mp)
        _record_rollouts(mp, f"{out_dir}/rollouts-rank{rank}.pt")
        out = f"{out_dir}/launch"
        trainer.train(config(out, max_steps=STEPS // 2, save_steps=STEPS // 2, **LAUNCH))
        trainer.train(config(out, save_steps=STEPS // 2, resume=True, **LAUNCH))


def reference(out_dir) -> list[dict]:
    """One process, no sequence parallelism, no FSDP, on the replicas' completions joined in rank order."""
    per_rank = [torch.load(f"{out_dir}/rollouts-rank{r}.pt", weights_only=False) for r in range(WORLD)]
    sp = LAUNCH["sequence_parallel"]
    for r in range(WORLD):  # the ranks of a sequence group sampled the same completions
        assert _tokens(per_rank[r]) == _tokens(per_rank[r - r % sp]), r
    joined = [sum((per_rank[r][k] for r in range(0, WORLD, sp)), []) for k in range(len(per_rank[0]))]
    real = sources.make_engine
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sources, "make_engine", lambda *args: Recorded(real(*args), None, replay=joined))
        trainer.train(config(f"{out_dir}/reference"))
    assert not joined  # every batch was trained on
    return read_metrics(f"{out_dir}/reference")


def _tokens(calls) -> list:
    return [[(c.prompt_ids, c.completion_ids, c.inserted) for c in comps] for comps in calls]


def mismatches(got: list[dict], ref: list[dict]) -> list[str]:
    bad = [f"steps {[r['step'] for r in got]}"] if [r["step"] for r in got] != list(range(1, STEPS + 1)) else []
    for g, r in zip(got, ref):
        for k in KEYS:
            if g[k] != pytest.approx(r[k], rel=1e-5, abs=1e-6):
                bad.append(f"step {r['step']} {k}: {g[k]} != {r[k]}")
    return bad


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_option_at_once_takes_the_one_process_steps(tmp_path):
    spawn(_worker, WORLD, tmp_path, str(tmp_path), PLANT)
    torch.set_num_threads(1)
    ref = reference(tmp_path)
    got = read_metrics(str(tmp_path / "launch"))
    if PLANT is not None:
        assert mismatches(got, ref), f"the launch with the {PLANT!r} bug planted equals the reference"
        return
    assert not mismatches(got, ref), mismatches(got, ref)
    # every option did something the comparison can see
    assert all(r["loss"] != 0 and r["grad_norm"] > 0 for r in ref)
    assert all(r["thinking_budget_cut_frac"] > 0.5 for r in ref)  # the spans the prompts open are cut
    assert all(r["kl_mean"] > 0 for r in ref[1::2])  # the second step of a batch moved away from the reference
    rollouts = torch.load(tmp_path / "rollouts-rank0.pt", weights_only=False)
    assert all(c.kept is not None and c.logprobs is not None for comps in rollouts for c in comps)
