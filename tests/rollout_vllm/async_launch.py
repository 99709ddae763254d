"""One rank of an asynchronous launch, run by torchrun: `async_launch.py OUT_DIR [train FLAGS...]`.

Every rank runs `trainer.train`: with the options of `test_async_options_together.py` on (`OPTIONS`, `LAUNCH`),
or given `train FLAGS...`, the run `fastrl train FLAGS...` would be. Rank 0 records every group it takes from the
rollout process, in order, to `OUT_DIR/groups.pt` (`async_replay.py` trains a reference on them). With
`FASTRL_PLANT=<name>` the bug `PLANTS[name]` is monkeypatched into every rank (and, for `chunks`, into the rollout
process, through its entry function).
"""

import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "distributed"))
import test_options_together as together  # noqa: E402  (the synchronous launch's plants)
from vllm_reference import ENGINE  # noqa: E402

from fastrl.trainer import async_source, trainer  # noqa: E402
from fastrl.trainer.cli import parse_config  # noqa: E402
from fastrl.trainer.config import make_config  # noqa: E402
from fastrl.trainer.rollout import async_client, async_worker  # noqa: E402

CHUNK = 4  # tokens per piece of a partial rollout: the tiny preset's completions (up to 12 tokens) take 1 to 3
OPTIONS = dict(
    ENGINE, warmup_sft_steps=60, prompts_per_step=4, group_size=4, max_steps=6, save_steps=0,
    async_staleness=2, rollout_chunk_tokens=CHUNK,  # K = 2 covers the batch's 2 steps
    minibatches=2, gradient_checkpointing=True, beta=0.05, is_cap=2.0,
    progress=False, plot=False, log_every=0,
)  # fmt: skip
LAUNCH = dict(sequence_parallel=2, fsdp=True)  # on 4 ranks: 2 data-parallel replicas of 2 sequence-parallel ranks
WORLD = 4


def config(out, **more):
    return make_config("tiny", **{"output_dir": str(out), **OPTIONS, **more})


def _behaviour(mp):  # the ratio taken against the policy at the batch's first step, not the behaviour policy
    real = async_source.attach_logprobs
    mp.setattr(async_source, "attach_logprobs", lambda run, samples, old: real(run, samples, True))


def _steps(mp):  # each step of a batch trains on its first minibatch
    mp.setattr(trainer, "minibatches", lambda n, epochs, per: [list(range(0, n, per))] * (epochs * per))


def _chunks(mp):  # the rollout process joins a completion's pieces' log-probs last piece first
    mp.setattr(async_client, "worker_main", planted_worker_main)


def planted_worker_main(*args) -> None:
    """The rollout process's entry with `_chunks`' bug in it (a spawn target: importable from here)."""
    real = async_worker.RolloutWorker._group

    def planted(self, prompt_id, g):
        for s in g.samples:
            starts = [sum(s.lengths[:i]) for i in range(len(s.lengths) + 1)]
            pieces = [s.logprobs[a:b] for a, b in zip(starts, starts[1:])]
            s.logprobs = [x for piece in reversed(pieces) for x in piece]
        return real(self, prompt_id, g)

    async_worker.RolloutWorker._group = planted
    async_worker.worker_main(*args)


PLANTS = {
    "sequence parallel": together.PLANTS["sequence parallel"],
    "data parallel": together.PLANTS["data parallel"],
    "fsdp": together.PLANTS["fsdp"],
    "checkpointing": together.PLANTS["checkpointing"],
    "beta": together.PLANTS["beta"],
    "is_cap": together.PLANTS["is_cap"],
    "steps": _steps,
    "async K>=1": _behaviour,
    "chunks": _chunks,
}


def main(out_dir: str, argv: list[str]) -> None:
    rank, taken = int(os.environ["RANK"]), []
    plant = os.environ.get("FASTRL_PLANT")
    with pytest.MonkeyPatch.context() as mp:
        if plant is not None:
            PLANTS[plant](mp)
        if rank == 0:
            real = async_client.AsyncRollout.next_group

            def recorded(self):
                group = real(self)
                taken.append(group)
                return group

            mp.setattr(async_client.AsyncRollout, "next_group", recorded)
        trainer.train(parse_config(argv)[0] if argv else config(os.path.join(out_dir, "launch"), **LAUNCH))
    if rank == 0:
        os.makedirs(out_dir, exist_ok=True)
        torch.save(taken, os.path.join(out_dir, "groups.pt"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
