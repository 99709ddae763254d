"""The asynchronous batch source (`--async-staleness K`): rollouts in a process of their own, updates here.

Per batch at policy version v (docs/math.md §10): `AsyncFeed.next_batch(v)` (rank 0) -> each rank's share ->
scored samples with the behaviour log-probs attached. The loop of `trainer.train` takes the batch's optimizer
steps; after each one the weights go to the rollout process as the next version (so K counts optimizer steps);
once the batch is done its prompts are marked trained in the ledger, which the checkpoint holds. Each step's
record adds its batch's staleness (at admission), dropped groups, queue depth, the busy / idle
timeline and the prompt ids of the batch. A resumed run re-queues what was in flight.
"""

import time

import torch

from .async_feed import AsyncFeed, dealt_prompt_ids, share_groups, timeline
from .batching import KeptSets
from .build import Run, build_model
from .config import TrainConfig
from .fsdp import is_sharded
from .prompt_ledger import PromptLedger
from .rollout import Completion, build_prompt
from .rollout.interface import end_token_ids
from .rollout.sampling import resolve_replay
from .rollout.vllm_engine import engine_replay_blocker, kv_cache_bytes, model_runner_v2, vllm_dtype
from .stages import Batch, attach_logprobs, score_batch
from .tiny import built_in
from .tiny.export import model_dir


def worker_spec(config, model, tokenizer, model_path: str):
    """The rollout process's engine settings: the in-process vLLM engine's, from the same config fields."""
    from .rollout.async_worker import WorkerSpec

    max_model_len = config.max_prompt_length + config.max_completion_length
    dtype = vllm_dtype(config, model)
    recorder = not model_runner_v2()  # the rollout process runs its engine core in itself: the recorder's records too
    replay = resolve_replay(config, engine_replay_blocker(config, recorder, in_process=False))
    return WorkerSpec(
        model=model_path,
        dtype=dtype,
        max_model_len=max_model_len,
        seed=config.seed,
        **config.sampler.engine_kwargs(),  # temperature, top_k, top_p, min_p in vLLM's numbers (0 / 1.0 / 0.0: off)
        max_tokens=config.max_completion_length,
        min_tokens=config.min_completion_length,
        stop_ids=tuple(end_token_ids(model, tokenizer)),
        chunk_tokens=config.rollout_chunk_tokens,
        kv_cache_bytes=kv_cache_bytes(config, model, dtype, max_model_len),
        enforce_eager=config.vllm_enforce_eager,
        gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        replay=("recorder" if recorder else "mask") if replay else "off",
    )


def completions_of(groups) -> list[Completion]:
    """The groups' completions, with their kept sets (received as NumPy arrays) where the rollout process sent them."""
    out = []
    for g in groups:
        kept = g.kept or [None] * len(g.completion_ids)
        for ids, lps, cut, sets in zip(g.completion_ids, g.logprobs, g.truncated, kept):
            sets = None if sets is None else KeptSets(torch.from_numpy(sets[0]), torch.from_numpy(sets[1]))
            out.append(Completion(list(g.prompt_ids), list(ids), cut, list(lps), kept=sets))
    return out


class AsyncSource:
    """Rank 0 owns the rollout process and its feed and deals the admitted groups; every rank trains its share."""

    def __init__(self, run: Run, config: TrainConfig, reward):
        from .rollout.async_client import AsyncRollout
        from .rollout.weight_push import WeightPush

        self.run, self.config, self.reward = run, config, reward
        self.K, self.lead = config.async_staleness, run.rank == 0
        state = run.async_state or {}
        self.ledger = PromptLedger.from_state(state) if state else PromptLedger(run.stream.position)
        self.rollout = self.push = self.export = self.feed = None
        sharded = is_sharded(run.model)
        if not (self.lead or sharded):
            return
        try:
            if not self.lead:  # a sharded model's full tensors are gathered by every rank: each takes part in a push
                self.push = WeightPush(None, run.model, rank=run.rank)
                self.push.push(run.step)
                return
            # vLLM loads the tiny model from an export whose weights the first push replaces: a sharded model exports an
            # unsharded copy
            exported = build_model(config, torch.device("cpu"))[0] if sharded and built_in(config.model) else run.model
            path, self.export = model_dir(config.model, exported, run.tokenizer)
            spec = worker_spec(config, run.model, run.tokenizer, path)
            self.rollout = AsyncRollout(spec, startup_timeout_s=config.rollout_timeout_s,
                                        timeout_s=config.rollout_timeout_s).start()  # fmt: skip
            self.push = WeightPush(self.rollout, run.model)
            self.push.push(run.step)
            self.feed = AsyncFeed(self.rollout, self.ledger, self._prompt_of, config.group_size,
                                  config.prompts_per_step, self.K, config.seed)  # fmt: skip
        except BaseException:
            self.close()
            raise

    def _prompt_of(self, pid: int) -> list[int]:
        c = self.config
        problem = self.run.stream.problem_at(pid)
        return build_prompt(self.run.tokenizer, problem.prompt, c.prompt_template, c.chat_template, c.max_prompt_length)

    def next_batch(self, version: int) -> Batch:
        t0 = time.time()
        groups, self.stats = self.feed.next_batch(version) if self.lead else (None, {})
        mine = share_groups(groups, self.run.sp.dp_size, self.run.sp.dp_rank)
        self.shares = dealt_prompt_ids(mine)
        problems = [self.run.stream.problem_at(g.prompt_id) for g in mine]
        comps = completions_of(mine)
        if self.K == 0 and self.config.loss.is_cap is None:  # the synchronous loop's samples exactly
            for c in comps:
                c.logprobs = None
        samples, rollout = score_batch(comps, problems, self.config, self.reward, self.run.tokenizer, self.run.sp)
        if self.K > 0:  # the ratio is clipped against the behaviour policy (docs/math.md §10)
            for s in samples:
                s.old_logprobs = s.rollout_logprobs
        attach_logprobs(self.run, samples, old=self.K == 0 and self.config.needs_old_logprobs)
        return Batch(samples, rollout, time.time() - t0, groups)

    def stepped(self, version: int) -> None:
        """The weights of `version` go to the rollout process: its next tokens are sampled as `version` (every rank
        of a sharded model takes part, rank 0 sends)."""
        if self.push is not None:
            self.push.push(version)

    def finished(self, batch: Batch) -> None:
        if self.lead:
            self.ledger.trained([g.prompt_id for g in batch.groups])

    def fields(self, batch: Batch, version: int, step_s: float) -> dict:
        """The step's async metrics, its batch's: staleness at admission (the version of the batch's first step;
        its later steps are epochs over it, as in the synchronous loop), drops, waits, the timeline of the step,
        the prompt ids (and each rank's)."""
        out = dict(self.stats)
        if self.stats:
            out.update(timeline(self.stats, step_s))
        out["trained_prompt_ids"] = [g.prompt_id for g in (batch.groups or [])]
        if self.shares is not None:
            out["rank_prompt_ids"] = self.shares
        return out

    def save_state(self) -> None:
        """The prompt ledger goes into the checkpoint; the stream resumes after the last prompt it issued."""
        self.run.async_state, self.run.stream.position = self.ledger.state_dict(), self.ledger.next_id

    def close(self) -> None:
        if self.rollout is not None:
            self.rollout.close()
        if self.export is not None:
            self.export.cleanup()
        self.rollout = self.export = None
