"""Scoring a rollout batch: rewards -> shaping -> advantages -> samples, and the batch's metric sums.

Pure functions of the completions and the few settings they read, a `ScoringSettings` built once from the run's
config (docs/math.md §4): no model, no sampling, no process group. The rollout stage (`stages.score_batch`) calls
them in order and does the cross-rank sums in between:

    texts = [reward_text(tokenizer, c) for c in completions]   # tool observations left out
    scores = score(reward, texts, golds, lengths, settings)
    batch_std = std_from_moments(*all_reduce(reward_moments(scores.total)))   # only for "batch-std"
    adv, flat = advantages(scores.total, settings, batch_std)
    samples = to_samples(completions, adv, flat, settings)
    metrics = rollout_metrics(all_reduce(rollout_sums(...)), all_reduce_max(max sampled_length))

Completions arrive grouped: rows [g*G, (g+1)*G) are the G samples of prompt g.
"""

import dataclasses
import math
from dataclasses import dataclass

import torch

from fastrl.rewards import batch_accuracy_reward, length_penalty, overlong_penalty

from .advantages import group_advantages, zero_std_groups
from .batching import Sample
from .rollout.tool_turns import tool_metrics, tool_sums


@dataclass(frozen=True)
class ScoringSettings:
    """What scoring reads of the run's config; `from_config` builds it once per run."""

    group_size: int  # G: completions [g*G, (g+1)*G) answer prompt g
    max_completion_length: int  # the overlong penalty's limit
    length_penalty: float = 0.0  # weight of the Kimi k1.5 length penalty (0 = off)
    overlong_buffer: int = 0  # DAPO soft overlong penalty over the last N tokens (0 = off)
    advantage_scale: str = "std"  # "std", "batch-std" or "none"
    filter_zero_std: bool = False  # drop groups whose rewards are all equal
    mask_truncated: bool = False  # truncated completions leave the loss
    thinking_budget: int = 0  # > 0: the batch's sums count the completions the budget cut

    @classmethod
    def from_config(cls, config) -> "ScoringSettings":
        """The settings of a `TrainConfig` (fields of the same names)."""
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class Scores:
    total: torch.Tensor  # [N] float64: the combined reward plus any length / overlong shaping
    correct: list[float]  # [N] the accuracy reward (0 or 1), also when accuracy is not a reward term
    per_fn: dict[str, list[float]]  # reward name -> [N] unweighted values of that term


def shaped_rewards(scores, correct: list[float], lengths: list[int], settings: ScoringSettings) -> torch.Tensor:
    """The combined reward plus the optional length (Kimi k1.5, per group) and overlong (DAPO) terms."""
    G = settings.group_size
    total = torch.tensor(scores.total, dtype=torch.float64)
    if settings.length_penalty:
        for start in range(0, len(lengths), G):
            sl = slice(start, start + G)
            pen = length_penalty(lengths[sl], [c > 0.5 for c in correct[sl]])
            total[sl] += settings.length_penalty * torch.tensor(pen, dtype=torch.float64)
    if settings.overlong_buffer:
        pen = [overlong_penalty(n, settings.max_completion_length, settings.overlong_buffer) for n in lengths]
        total += torch.tensor(pen, dtype=torch.float64)
    return total


def score(reward, texts: list[str], golds: list[str], lengths: list[int], settings: ScoringSettings) -> Scores:
    """Score N = groups * G completion texts against their gold answers; `lengths` are their token counts."""
    if not len(texts) == len(golds) == len(lengths):
        raise ValueError(f"{len(texts)} texts, {len(golds)} gold answers and {len(lengths)} lengths must match")
    if len(texts) % settings.group_size:
        raise ValueError(f"{len(texts)} completions do not split into groups of {settings.group_size}")
    scores = reward.score(texts, golds)
    correct = scores.per_fn["accuracy"] if "accuracy" in scores.per_fn else batch_accuracy_reward(texts, golds)
    total = shaped_rewards(scores, correct, lengths, settings)
    return Scores(total, list(correct), dict(scores.per_fn))


def reward_moments(total: torch.Tensor) -> list[float]:
    """[count, sum, sum of squares] of the rewards: what ranks add up for the batch std."""
    return [total.numel(), float(total.sum()), float((total**2).sum())]


def std_from_moments(n: float, s: float, s2: float) -> float:
    """The unbiased std of all rewards from their (global) count, sum and sum of squares."""
    return math.sqrt(max(s2 - s * s / n, 0.0) / max(n - 1, 1))


def advantages(total: torch.Tensor, settings: ScoringSettings, batch_std: float | None = None
               ) -> tuple[list[float], torch.Tensor]:  # fmt: skip
    """Per-completion advantages `[N]` and the `[N // G]` bool mask of zero-variance groups."""
    adv = group_advantages(total, settings.group_size, settings.advantage_scale, batch_std=batch_std).tolist()
    return adv, zero_std_groups(total, settings.group_size)


def to_samples(completions, adv: list[float], flat: torch.Tensor, settings: ScoringSettings) -> list[Sample]:
    """Training samples: zero-variance groups dropped if `filter_zero_std`; truncated ones masked if asked.

    Tokens an engine inserted (the thinking budget's sentence and marker, tool observations) get token mask 0:
    the policy did not sample them, so they carry no loss and no importance ratio.
    """
    G = settings.group_size
    drop = flat.repeat_interleave(G).tolist() if settings.filter_zero_std else [False] * len(completions)
    kept = [(c, a) for c, a, d in zip(completions, adv, drop) if not d]
    return [
        Sample(c.prompt_ids, c.completion_ids, a, not (settings.mask_truncated and c.truncated),
               rollout_logprobs=c.logprobs, token_mask=sampled_mask(c), kept=c.kept)
        for c, a in kept
    ]  # fmt: skip


def sampled_mask(completion) -> list[float] | None:
    """1.0 for each completion token the policy sampled, 0.0 for inserted ones; None when no span was inserted."""
    if not completion.inserted:
        return None
    mask = [1.0] * len(completion.completion_ids)
    for start, end, _ in completion.inserted:
        mask[start:end] = [0.0] * (end - start)
    return mask


def reward_text(tokenizer, completion) -> str:
    """The completion's text as the reward sees it: every token but the tool observations' (the thinking budget's
    inserted sentence and marker stay: the format reward reads its `</think>`). A tool's output cannot earn a
    reward by itself: an answer the model copies from it counts once the model writes it. The pieces around each
    observation are decoded apart and joined by a newline, so no answer is spelled across an observation."""
    ids, pieces, at = completion.completion_ids, [], 0
    for start, end, kind in completion.inserted:
        if kind == "tool":
            pieces.append(ids[at:start])
            at = end
    pieces.append(ids[at:])
    return "\n".join(tokenizer.decode(p, skip_special_tokens=True) for p in pieces)


def inserted_length(completion) -> int:
    """The completion's tokens the engine inserted (tool observations, the thinking budget's sentence)."""
    return sum(end - start for start, end, _ in completion.inserted)


def sampled_length(completion) -> int:
    """The completion's tokens the policy sampled: its response length."""
    return len(completion.completion_ids) - inserted_length(completion)


def rollout_sums(completions, prompt_lengths: list[int], scores: Scores, flat: torch.Tensor,
                 settings: ScoringSettings) -> dict:  # fmt: skip
    """This rank's additive statistics of the batch; `rollout_metrics` turns their global sums into means. The
    response length counts sampled tokens; inserted ones are counted apart (`inserted_tokens`)."""
    lengths = [sampled_length(c) for c in completions]
    return {
        "n": len(completions), "reward": float(scores.total.sum()), "reward_sq": float((scores.total**2).sum()),
        "correct": sum(scores.correct), "flat_groups": float(flat.sum()), "groups": len(prompt_lengths),
        "length": sum(lengths), "inserted": sum(inserted_length(c) for c in completions),
        "truncated": sum(c.truncated for c in completions),
        "prompt_tokens": sum(prompt_lengths) * settings.group_size,
        **{f"reward_{k}_mean": sum(v) for k, v in scores.per_fn.items()},
        **(_thinking_sums(completions) if settings.thinking_budget else {}),
        **tool_sums(completions),
    }  # fmt: skip


def _thinking_sums(completions) -> dict:
    cut = [span for c in completions for span in c.inserted if span.kind == "thinking"]
    return {"thinking_cut": len(cut), "thinking_inserted": sum(span.end - span.start for span in cut)}


def rollout_metrics(sums: dict, length_max: float) -> dict:
    """The batch's logged rollout metrics from the (all-ranks) sums and the longest response (sampled tokens)."""
    n = sums["n"]
    out = {
        "reward_mean": sums["reward"] / n,
        "reward_std": math.sqrt(max(sums["reward_sq"] / n - (sums["reward"] / n) ** 2, 0.0)),
        "reward_correct_mean": sums["correct"] / n,
        "frac_zero_std_groups": sums["flat_groups"] / sums["groups"],
        "response_length_mean": sums["length"] / n,
        "response_length_max": length_max,
        "truncation_rate": sums["truncated"] / n,
        "inserted_tokens": sums["inserted"],
        "rollout_tokens": sums["length"] + sums["inserted"] + sums["prompt_tokens"],
        **{k: v / n for k, v in sums.items() if k.startswith("reward_") and k.endswith("_mean")},
    }
    if "thinking_cut" in sums:  # a thinking budget: the share of completions cut, the tokens inserted in all
        out["thinking_budget_cut_frac"] = sums["thinking_cut"] / n
        out["thinking_budget_inserted_tokens"] = sums["thinking_inserted"]
    return {**out, **tool_metrics(sums)}
