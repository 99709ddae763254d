"""The asynchronous training loop (`--async-staleness K`): rollouts in their own process, updates here.

`trainer.train` calls `train_async` when `config.async_staleness` is set. Per optimizer step at version v
(docs/math.md §10): `AsyncFeed.next_batch(v)` (rank 0) -> each rank's share -> scored samples, the behaviour
log-probs attached -> one optimizer step -> the weights pushed as version v + 1 -> the step's record (the
synchronous loop's, plus staleness, dropped groups, queue depth, the busy / idle timeline and the prompt ids
it trained on) -> a checkpoint that holds the prompt ledger. A resumed run re-queues what was in flight.
"""

import tempfile
import time

from .async_loop import AsyncFeed, dealt_prompt_ids, share_groups, timeline
from .prompt_ledger import PromptLedger
from .rollout import Completion, build_prompt
from .rollout.engine import end_token_ids
from .rollout.vllm_engine import kv_cache_bytes, vllm_dtype
from .stages import optimizer_step, save_run, score_batch, should_save, step_record


def worker_spec(config, model, tokenizer, model_path: str):
    """The rollout process's engine settings: the in-process vLLM engine's, from the same config fields."""
    from .rollout.async_worker import WorkerSpec

    max_model_len = config.max_prompt_length + config.max_completion_length
    dtype = vllm_dtype(config, model)
    return WorkerSpec(
        model=model_path,
        dtype=dtype,
        max_model_len=max_model_len,
        seed=config.seed,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        min_p=config.min_p,
        max_tokens=config.max_completion_length,
        min_tokens=config.min_completion_length,
        stop_ids=tuple(end_token_ids(model, tokenizer)),
        chunk_tokens=config.rollout_chunk_tokens,
        kv_cache_bytes=kv_cache_bytes(config, model, dtype, max_model_len),
        enforce_eager=config.vllm_enforce_eager,
        gpu_memory_utilization=config.vllm_gpu_memory_utilization,
    )


def completions_of(groups) -> list[Completion]:
    return [
        Completion(list(g.prompt_ids), list(ids), cut, list(lps))
        for g in groups
        for ids, lps, cut in zip(g.completion_ids, g.logprobs, g.truncated)
    ]


def train_async(run, config, reward, logger, report) -> dict:
    """The loop of `trainer.train` for `config.async_staleness` set; `report(record)` prints progress."""
    from .rollout.async_client import AsyncRollout
    from .rollout.weight_push import WeightPush

    K, lead = config.async_staleness, run.rank == 0
    state = getattr(run, "async_state", None) or {}
    ledger = PromptLedger.from_state(state) if state else PromptLedger(run.stream.position)

    def prompt_of(pid: int) -> list[int]:
        problem = run.stream.problem_at(pid)
        return build_prompt(run.tokenizer, problem.prompt, config.prompt_template, config.chat_template,
                            config.max_prompt_length)  # fmt: skip

    rollout = push = export = None
    record, t_run = {}, time.time()
    try:
        if lead:
            path = config.model
            if config.model == "tiny":
                from .tiny.export import save_tiny

                export = tempfile.TemporaryDirectory(prefix="fastrl-tiny-")
                path = save_tiny(run.model, run.tokenizer, export.name)
            spec = worker_spec(config, run.model, run.tokenizer, path)
            rollout = AsyncRollout(spec, startup_timeout_s=config.rollout_timeout_s,
                                   timeout_s=config.rollout_timeout_s).start()  # fmt: skip
            push = WeightPush(rollout, run.model)
            push.push(run.step)
            feed = AsyncFeed(rollout, ledger, prompt_of, config.group_size, config.prompts_per_step, K, config.seed)
        while run.step < config.max_steps:
            t0 = time.time()
            groups, stats = feed.next_batch(run.step) if lead else (None, {})
            mine = share_groups(groups)
            shares = dealt_prompt_ids(mine)
            problems = [run.stream.problem_at(g.prompt_id) for g in mine]
            comps = completions_of(mine)
            if K == 0 and config.loss.is_cap is None:  # the synchronous loop's samples exactly
                for c in comps:
                    c.logprobs = None
            samples, rollout_metrics = score_batch(comps, problems, config, reward, run.tokenizer)
            if K > 0:  # the ratio is clipped against the behaviour policy (docs/math.md §10)
                for s in samples:
                    s.old_logprobs = s.rollout_logprobs
            t_rollout = time.time() - t0
            update = optimizer_step(run, samples)
            trained = [g.prompt_id for g in (groups or [])]
            if lead:
                ledger.trained(trained)
                push.push(run.step)
            step_s = time.time() - t0
            record = step_record(run.step, rollout_metrics, update, t_rollout, step_s)
            record.update(stats)
            if stats:
                record.update(timeline(stats, step_s))
            record["trained_prompt_ids"] = trained
            if shares is not None:
                record["rank_prompt_ids"] = shares
            record["elapsed_s"] = run.elapsed_before + time.time() - t_run
            logger.log(record)
            report(record)
            if should_save(run.step, config):
                run.async_state, run.stream.position = ledger.state_dict(), ledger.next_id
                save_run(run, config, run.elapsed_before + time.time() - t_run)
    finally:
        if rollout is not None:
            rollout.close()
        if export is not None:
            export.cleanup()
    return record
