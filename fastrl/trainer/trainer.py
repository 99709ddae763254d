"""GRPO trainer: the loop that ties rollouts, rewards, advantages and the fused-loss update together.

Algorithm (DeepSeekMath / R1 GRPO), per rollout batch:
  1. take `prompts_per_step` prompts (each rank its own shard) and sample G completions of each;
  2. score them (accuracy + format by default; optional length / overlong shaping);
  3. advantages A_i = (R_i - mean_group R) / (std_group R + 1e-4) (or batch std, or none; docs/math.md §4);
  4. if the batch feeds several optimizer steps (ppo_epochs * minibatches > 1), record the sampling
     policy's log-probs once; with beta > 0, the frozen reference model's log-probs;
  5. per optimizer step: token-budget micro-batches, the fused clipped-surrogate loss with the GLOBAL
     normalizer (docs/math.md §2-3), gradients summed over ranks, clipping, AdamW, LR schedule;
  6. push the new weights to the rollout engine (vLLM); every `eval_every` steps evaluate the new weights on the
     eval sets (`evaluation.py`: no gradient, every generator restored), on the same row; log (metrics.jsonl and
     the `--report-to` trackers), checkpoint; after the last step, `<output_dir>/curves.png` with `--plot`.

Where a batch's samples come from is a batch source (`sources.py`): this process's engine (steps 1-4), or with
`--async-staleness K` a rollout process of its own (`async_source.py`, docs/math.md §10). The loop below is the
same for both: a batch, its optimizer steps (each step's record, log line and progress), the batch's end, a
checkpoint. The stages are functions in `build.py` (setting up) and `stages.py` (one iteration).

Run it:  fastrl train --preset tiny --output-dir runs/tiny          (CPU, a few minutes)
         torchrun --nproc-per-node 8 -m fastrl.trainer train --preset math-32k --model <hf id>
"""

import os
import sys
import time

from . import distributed as dist_utils
from .async_source import AsyncSource
from .build import start_run
from .config import TrainConfig, config_to_dict
from .eval_options import eval_due
from .evaluation import Evaluator, load_eval_sets
from .metrics import MetricsLogger, progress_line, read_metrics
from .plot import plot_runs
from .preflight import preflight, with_tools
from .rollout import check_engine_available
from .sources import SyncSource
from .stages import minibatches, optimizer_step, save_run, should_save, step_record
from .trackers import open_trackers


def train(config: TrainConfig, rewards=None, tools=None) -> dict:
    """Run GRPO as configured; returns the last step's metrics. Resumable from `config.output_dir`.

    `rewards` replaces `config.rewards`: a list of specs ("accuracy:1.0", "my_module:my_fn:0.5") and / or
    reward terms, `(fn, weight)`, `(name, fn, weight)` or `fastrl.rewards.WeightedReward`, where `fn(completion,
    gold) -> float`. `tools` adds user tools to `config.tools` (TRL's `tools=`): module-level Python functions, each
    run as `--tools module:function` would be. Raises ConfigError (a ValueError) before building anything when a
    setting cannot work.
    """
    t_start = time.time()
    config = with_tools(config, tools)
    check_engine_available(config.engine)
    reward = preflight(config, rewards)
    eval_sets = load_eval_sets(config)  # before the model: a set that does not load costs no warm-up
    run = start_run(config)
    if run.step >= config.max_steps and run.rank == 0:
        print(f"fastrl: {config.output_dir} already finished at step {run.step} (max_steps={config.max_steps})",
              file=sys.stderr, flush=True)  # fmt: skip
    per_batch = config.ppo_epochs * config.minibatches
    resume_step = run.step if run.resumed else None
    trackers = open_trackers(config.trackers, config.output_dir, rank=run.rank, run_name=config.run_name or None,
                             project=config.project or None, resume_step=resume_step,
                             config=config_to_dict(config))  # fmt: skip
    logger = MetricsLogger(config.output_dir, resume_step, enabled=run.rank == 0, trackers=trackers)
    report = _reporter(config, run.step, run.rank == 0)
    t_run, record, source, evaluator = time.time(), {}, None, None
    try:
        if run.step < config.max_steps:  # rollouts in a process of their own with async_staleness set, else here
            source = (AsyncSource if config.async_staleness >= 0 else SyncSource)(run, config, reward)
            if eval_sets:  # the synchronous vLLM engine samples the eval too; else HF generate on run.model
                evaluator = Evaluator(config, reward, eval_sets, run, getattr(source, "engine", None))
        if evaluator is not None and run.step == 0 and eval_due(0, config):
            logger.log({"step": 0, **evaluator.evaluate(run, 0), "elapsed_s": time.time() - t_run})
        while run.step < config.max_steps:
            t0 = time.time()
            batch = source.next_batch(run.step)
            for chunk in minibatches(len(batch.samples), config.ppo_epochs, config.minibatches):
                if run.step >= config.max_steps:
                    continue  # later epochs still shuffle: the RNG state the checkpoint saves stays the same
                version = run.step
                update = optimizer_step(run, [batch.samples[i] for i in chunk])
                source.stepped(run.step)
                step_s = time.time() - t0
                record = step_record(run.step, batch.rollout, update, batch.rollout_s, step_s)
                record.update(source.fields(batch, version, step_s))
                if evaluator is not None and eval_due(run.step, config):
                    record.update(evaluator.evaluate(run, run.step))
                record["elapsed_s"] = run.elapsed_before + time.time() - t_run
                logger.log(record)
                report(record)
            source.finished(batch)
            if should_save(run.step, config.save_steps, config.max_steps, per_batch):
                source.save_state()
                save_run(run, config, run.elapsed_before + time.time() - t_run)
    finally:
        if source is not None:
            source.close()
        report(None)
        logger.close()
    if config.plot and run.rank == 0:
        plot_runs([config.output_dir], os.path.join(config.output_dir, "curves.png"))
    if run.own_group:
        dist_utils.cleanup()
    if not record and run.resumed:  # nothing left to do: report the finished run's last step
        rows = [r for r in read_metrics(config.output_dir) if r.get("step") == run.step]
        record = dict(rows[-1]) if rows else {"step": run.step}
    record["total_wall_s"] = time.time() - t_start
    return record


def _reporter(config: TrainConfig, step: int, lead: bool):
    """`report(record)`: the progress bar's tick or every `log_every`-th step's line on stderr (rank 0);
    `report(None)` closes the bar."""
    bar = None
    if config.progress and lead:
        from tqdm import tqdm

        bar = tqdm(total=config.max_steps, initial=step, desc="grpo", dynamic_ncols=True)
    log_every = config.log_every if not config.progress and lead else 0

    def report(record: dict | None) -> None:
        if record is None:
            if bar is not None:
                bar.close()
            return
        if log_every and (record["step"] % log_every == 0 or record["step"] == config.max_steps):
            print(progress_line(record, config.max_steps), file=sys.stderr, flush=True)
        if bar is not None:
            bar.set_postfix(reward=f"{record['reward_correct_mean']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
            bar.update(1)

    return report
