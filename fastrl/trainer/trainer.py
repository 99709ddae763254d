"""GRPO trainer: the loop that ties rollouts, rewards, advantages and the fused-loss update together.

Algorithm (DeepSeekMath / R1 GRPO), per rollout batch:
  1. take `prompts_per_step` prompts (each rank its own shard) and sample G completions of each;
  2. score them (accuracy + format by default; optional length / overlong shaping);
  3. advantages A_i = (R_i - mean_group R) / (std_group R + 1e-4) (or batch std, or none; docs/math.md §4);
  4. if the batch feeds several optimizer steps (ppo_epochs * minibatches > 1), record the sampling
     policy's log-probs once; with beta > 0, the frozen reference model's log-probs;
  5. per optimizer step: token-budget micro-batches, the fused clipped-surrogate loss with the GLOBAL
     normalizer (docs/math.md §2-3), gradients summed over ranks, clipping, AdamW, LR schedule;
  6. push the new weights to the rollout engine (vLLM), log, checkpoint.

The stages are functions in `build.py` (setting up) and `stages.py` (one iteration); this module only
orders them. With `--async-staleness K` the rollouts run in a process of their own (`async_train.py`).

Run it:  fastrl train --preset tiny --output-dir runs/tiny          (CPU, a few minutes)
         torchrun --nproc-per-node 8 -m fastrl.trainer train --preset math-32k --model <hf id>
"""

import sys
import time

from . import distributed as dist_utils
from .async_train import train_async
from .build import start_run
from .config import TrainConfig
from .metrics import MetricsLogger, progress_line, read_metrics
from .preflight import preflight
from .rollout import check_engine_available, make_engine
from .stages import attach_logprobs, collect, minibatches, optimizer_step, save_run, should_save, step_record


def train(config: TrainConfig, rewards=None) -> dict:
    """Run GRPO as configured; returns the last step's metrics. Resumable from `config.output_dir`.

    `rewards` replaces `config.rewards`: a list of specs ("accuracy:1.0", "my_module:my_fn:0.5") and / or
    reward terms, `(fn, weight)`, `(name, fn, weight)` or `fastrl.rewards.WeightedReward`, where `fn(completion,
    gold) -> float`. Raises ConfigError (a ValueError) before building anything when a setting cannot work.
    """
    t_start = time.time()
    check_engine_available(config.engine)
    reward = preflight(config, rewards)
    run = start_run(config)
    logger = MetricsLogger(config.output_dir, run.step if run.resumed else None, config.tensorboard,
                           enabled=run.rank == 0)  # fmt: skip
    bar = _progress_bar(config, run.step) if config.progress and run.rank == 0 else None
    log_every = config.log_every if not config.progress and run.rank == 0 else 0

    def report(record: dict) -> None:
        if log_every and (run.step % log_every == 0 or run.step == config.max_steps):
            print(progress_line(record, config.max_steps), file=sys.stderr, flush=True)
        if bar is not None:
            bar.set_postfix(reward=f"{record['reward_correct_mean']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
            bar.update(1)

    if run.step >= config.max_steps and run.rank == 0:
        print(f"fastrl: {config.output_dir} already finished at step {run.step} (max_steps={config.max_steps})",
              file=sys.stderr, flush=True)  # fmt: skip
    t_run, record = time.time(), {}
    if config.async_staleness >= 0:  # rollouts in a process of their own: async_train.py
        record = train_async(run, config, reward, logger, report) if run.step < config.max_steps else {}
    else:
        engine = make_engine(config.engine, run.model, run.tokenizer, config)
        engine.sync_weights(run.model)  # vLLM loaded config.model from disk; these weights may be warmed up or resumed
    while config.async_staleness < 0 and run.step < config.max_steps:
        t0, start = time.time(), run.stream.position
        batch = dist_utils.shard(run.stream.next_batch(config.prompts_per_step), run.sp.dp_size, run.sp.dp_rank)
        prompt_ids = dist_utils.shard(list(range(start, run.stream.position)), run.sp.dp_size, run.sp.dp_rank)
        samples, rollout = collect(engine, run.tokenizer, batch, config, reward, run.sp, prompt_ids)
        attach_logprobs(run, samples, config)
        t_rollout = time.time() - t0
        for chunk in minibatches(len(samples), config):
            if run.step >= config.max_steps:
                continue  # later epochs still shuffle: the RNG state the checkpoint saves stays the same
            update = optimizer_step(run, [samples[i] for i in chunk])
            record = step_record(run.step, rollout, update, t_rollout, time.time() - t0)
            record["elapsed_s"] = run.elapsed_before + time.time() - t_run
            logger.log(record)
            report(record)
        engine.sync_weights(run.model)
        if should_save(run.step, config):
            save_run(run, config, run.elapsed_before + time.time() - t_run)
    if bar is not None:
        bar.close()
    logger.close()
    if run.own_group:
        dist_utils.cleanup()
    if not record and run.resumed:  # nothing left to do: report the finished run's last step
        rows = [r for r in read_metrics(config.output_dir) if r.get("step") == run.step]
        record = dict(rows[-1]) if rows else {"step": run.step}
    record["total_wall_s"] = time.time() - t_start
    return record


def _progress_bar(config: TrainConfig, step: int):
    from tqdm import tqdm

    return tqdm(total=config.max_steps, initial=step, desc="grpo", dynamic_ncols=True)
