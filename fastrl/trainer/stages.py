"""The stages of one GRPO iteration, each an importable function; the batch sources (`sources.py`) and the
loop in `trainer.py` call them in order:

Batch            one rollout batch of this rank (what a batch source gives the loop)
collect          sample G completions per prompt, then score_batch: scores, advantages (`scoring.py`), sums; each
                 takes the few settings it reads (`CollectSettings`, `scoring.ScoringSettings`), built once per run
attach_logprobs  the current policy's log-probs (several steps per batch) and the reference's (beta > 0)
minibatches      the optimizer steps' sample indices: ppo_epochs passes, each shuffled and split
optimizer_step   one fused-loss update (`update.train_step`) and the LR schedule step
step_record      one metrics.jsonl line
should_save / save_run   checkpoints on rollout boundaries
"""

import random
import warnings
from dataclasses import dataclass

from . import distributed as dist_utils
from . import scoring
from .batching import Sample
from .build import Run
from .checkpoint import save_checkpoint
from .config import TrainConfig, config_to_dict
from .rollout import RolloutEngine, build_prompt
from .sequence_parallel import SequenceParallel, check_same_rollouts
from .sharded_checkpoint import save_sharded
from .tool_options import tool_schemas
from .update import sequence_logprobs, train_step


@dataclass
class Batch:
    """One rollout batch of this rank: the samples its optimizer steps train on."""

    samples: list[Sample]
    rollout: dict  # the rollout metrics, summed over the data-parallel ranks
    rollout_s: float  # seconds from asking for the batch to having it
    groups: list | None = None  # the asynchronous source's admitted groups (rank 0), else None


@dataclass(frozen=True)
class CollectSettings:
    """What `collect` reads of the run's config; `from_config` builds it once per run."""

    prompt_template: str  # the user message; {prompt} is the question
    chat_template: bool  # wrap the prompt with the tokenizer's chat template
    max_prompt_length: int  # prompts are left-truncated to this many tokens
    want_logprobs: bool  # the sampler's log-probs of each token (the IS correction needs them)
    scoring: scoring.ScoringSettings
    tools: tuple[dict, ...] = ()  # the JSON schemas the chat template lists (hermes tool format), else ()

    @classmethod
    def from_config(cls, config: TrainConfig) -> "CollectSettings":
        return cls(config.prompt_template, config.chat_template, config.max_prompt_length,
                   config.loss.is_cap is not None, scoring.ScoringSettings.from_config(config),
                   tool_schemas(config))  # fmt: skip


def collect(engine: RolloutEngine, tokenizer, problems, settings: CollectSettings, reward,
            sp: SequenceParallel | None = None,
            prompt_ids: list[int] | None = None) -> tuple[list[Sample], dict]:  # fmt: skip
    """Sample G completions per problem, score them, compute advantages; samples + rollout metrics.

    `prompt_ids` (the problems' stream positions) seed each request of an engine that takes seeds (vLLM). The
    batch's sums run over the data-parallel group of `sp` (None: every rank): the ranks of a sequence group hold
    the same rollouts, which must count once.
    """
    prompts = [build_prompt(tokenizer, p.prompt, settings.prompt_template, settings.chat_template,
                            settings.max_prompt_length, settings.tools) for p in problems]  # fmt: skip
    seeded = {"prompt_ids": prompt_ids} if prompt_ids is not None and getattr(engine, "seeded", False) else {}
    comps = engine.generate(prompts, settings.scoring.group_size, want_logprobs=settings.want_logprobs, **seeded)
    return score_batch(comps, problems, settings.scoring, reward, tokenizer, sp)


def score_batch(comps, problems, settings: scoring.ScoringSettings, reward, tokenizer,
                sp: SequenceParallel | None = None) -> tuple[list[Sample], dict]:  # fmt: skip
    """Scores, advantages, samples and the rollout metrics (summed over the data-parallel ranks) of G completions
    per problem, grouped: completions [i*G : (i+1)*G] answer problems[i]."""
    group = None if sp is None else sp.dp_group
    G = settings.group_size
    texts = [scoring.reward_text(tokenizer, c) for c in comps]  # without tool observations: they earn nothing
    golds = [p.answer for p in problems for _ in range(G)]
    lengths = [len(c.completion_ids) for c in comps]  # the shaping's length: what max_completion_length caps
    scores = scoring.score(reward, texts, golds, lengths, settings)
    batch_std = None
    if settings.advantage_scale == "batch-std":  # the std over all ranks' rewards
        moments = dist_utils.all_reduce_sum_list(scoring.reward_moments(scores.total), group)
        batch_std = scoring.std_from_moments(*moments)
    adv, flat = scoring.advantages(scores.total, settings, batch_std)
    samples = scoring.to_samples(comps, adv, flat, settings)
    if sp is not None:
        check_same_rollouts(samples, sp)
    prompt_lengths = [len(comps[i * G].prompt_ids) for i in range(len(problems))]
    local = scoring.rollout_sums(comps, prompt_lengths, scores, flat, settings)
    sums = dict(zip(local, dist_utils.all_reduce_sum_list([float(v) for v in local.values()], group)))
    longest = max((scoring.sampled_length(c) for c in comps), default=0)
    return samples, scoring.rollout_metrics(sums, dist_utils.all_reduce_max(float(longest), group))


def attach_logprobs(run: Run, samples: list[Sample], old: bool) -> None:
    """Freeze the current policy's log-probs as `old_logprobs` when `old` (the batch feeds several steps and no
    behaviour policy's stand in); add the reference's when the run has one (beta > 0)."""
    targets = [("old_logprobs", run.model)] if old else []
    targets += [("ref_logprobs", run.ref_model)] if run.ref_model is not None else []
    for field, model in targets:
        for s, lp in zip(samples, sequence_logprobs(model, samples, run.settings)):
            setattr(s, field, lp)


def minibatches(n: int, ppo_epochs: int, per_epoch: int):
    """Sample indices of each optimizer step: `ppo_epochs` passes (shuffled when > 1), `per_epoch` steps each."""
    for _ in range(ppo_epochs):
        order = list(range(n))
        if ppo_epochs > 1:
            random.shuffle(order)
        yield from (order[i::per_epoch] for i in range(per_epoch))


def optimizer_step(run: Run, samples: list[Sample]) -> dict:
    """One update on this rank's share of a minibatch; advances the schedule and `run.step`."""
    run.model.train()
    metrics = train_step(run.model, run.optimizer, samples, run.settings)
    metrics["lr"] = run.scheduler.get_last_lr()[0]
    with warnings.catch_warnings():  # a step with nothing to train skips optimizer.step()
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step()`")
        run.scheduler.step()
    run.step += 1
    return metrics


def step_record(step: int, rollout: dict, update: dict, rollout_s: float, step_s: float) -> dict:
    """One metrics.jsonl line: the rollout batch's metrics and this optimizer step's (the loss's names)."""
    return {
        "step": step,
        **rollout,
        "loss": update["loss"],
        "kl_mean": update["kl_mean"],
        "clip_frac_low": update["clip_frac_low"],
        "clip_frac_high": update["clip_frac_high"],
        "ratio_mean": update["ratio_mean"],
        "entropy_mean": update["entropy_mean"],
        "grad_norm": update["grad_norm"],
        "update_skipped": update["update_skipped"],
        "replay_missing_tokens": update["replay_missing_tokens"],
        "lr": update["lr"],
        "train_tokens": update["num_tokens"],
        "rollout_s": rollout_s,
        "step_s": step_s,
        "tokens_per_s": rollout["rollout_tokens"] / max(step_s, 1e-9),
    }


def should_save(step: int, save_steps: int, max_steps: int, per_batch: int) -> bool:
    """Save at the end, and at the first batch boundary at or after each multiple of `save_steps`.

    Checkpoints fall on batch boundaries (`per_batch` optimizer steps apart) so a resumed run never re-does half a
    rollout batch.
    """
    periodic = save_steps > 0 and step >= save_steps and step % save_steps < per_batch
    return periodic or step >= max_steps


def save_run(run: Run, config: TrainConfig, elapsed_s: float) -> str:
    """Checkpoint the run (every rank calls this); the path of the new checkpoint."""
    extra = {"data_position": run.stream.position, "elapsed_s": elapsed_s, "config": config_to_dict(config)}
    if run.async_state is not None:  # the prompt ledger of an asynchronous run
        extra["async_state"] = run.async_state
    if config.fsdp:
        return save_sharded(config.output_dir, run.step, run.model, run.optimizer, run.scheduler, extra,
                            config.keep_checkpoints, run.ref_model)  # fmt: skip
    if run.ref_model is not None:
        extra["ref_model"] = run.ref_model.state_dict()
    return save_checkpoint(
        config.output_dir, run.step, run.model, run.optimizer, run.scheduler, extra, config.keep_checkpoints
    )
