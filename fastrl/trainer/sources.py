"""Where a step's samples come from: the batch sources the one loop of `trainer.train` draws from.

A source gives the loop a `Batch` (scored samples with their log-probs attached, the rollout metrics) for the
policy version the loop is at, hears of every new version (`stepped`) and of a batch whose optimizer steps are
done (`finished`), adds its own fields to each step's record, and puts its resume state on the run before a
checkpoint. Two sources:

SyncSource   the engine in this process: collect (sample, score) -> attach log-probs; the engine takes the new
             weights once the batch's steps are done
AsyncSource  (`async_source.py`, `--async-staleness K`) the rollout process's feed: admission, the prompt
             ledger, a weight push per version
"""

import time

from . import distributed as dist_utils
from .build import Run
from .config import TrainConfig
from .rollout import make_engine
from .stages import Batch, CollectSettings, attach_logprobs, collect


class SyncSource:
    """Sample, score and attach log-probs in this process, then train on the result (the synchronous loop)."""

    def __init__(self, run: Run, config: TrainConfig, reward):
        self.run, self.config, self.reward = run, config, reward
        self.settings = CollectSettings.from_config(config)
        self.engine = make_engine(config.engine, run.model, run.tokenizer, config)
        self.engine.sync_weights(run.model)  # vLLM loaded config.model from disk; these may be warmed up or resumed

    def next_batch(self, version: int) -> Batch:
        t0, run = time.time(), self.run
        start = run.stream.position
        problems = dist_utils.shard(run.stream.next_batch(self.config.prompts_per_step), run.sp.dp_size, run.sp.dp_rank)
        prompt_ids = dist_utils.shard(list(range(start, run.stream.position)), run.sp.dp_size, run.sp.dp_rank)
        samples, rollout = collect(self.engine, run.tokenizer, problems, self.settings, self.reward, run.sp, prompt_ids)
        attach_logprobs(run, samples, old=self.config.needs_old_logprobs)
        return Batch(samples, rollout, time.time() - t0)

    def stepped(self, version: int) -> None:
        """The engine samples nothing until the next batch: it takes the weights once, in `finished`."""

    def finished(self, batch: Batch) -> None:
        self.engine.sync_weights(self.run.model)

    def fields(self, batch: Batch, version: int, step_s: float) -> dict:
        return {}

    def save_state(self) -> None:
        """The prompt stream's position is the whole resume state, and the checkpoint saves it."""

    def close(self) -> None:
        pass
