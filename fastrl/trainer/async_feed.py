"""Asynchronous GRPO: the rollout process generates while the trainer updates (docs/math.md §10).

`fastrl train --async-staleness K` (vLLM engine only). Rank 0 owns a rollout process (`rollout/async_client`)
and, per optimizer step:
  1. keeps up to (K + 1) · prompts_per_step prompts out with it (ids from the `PromptLedger`, re-queued first);
  2. takes finished groups in completion order (with K = 0 in prompt order: the synchronous order), admits
     those whose oldest token is at most K versions behind, drops (counts, re-queues) the others;
  3. scores the prompts_per_step admitted groups into samples whose behaviour log-probs are vLLM's processed
     ones (with K > 0 also the loss's `old_logprobs`: the ratio is clipped against the behaviour policy);
  4. takes the optimizer step, pushes the weights as the new version, logs the step's staleness, the dropped
     groups, the queue depth, each side's busy / idle time and the prompt ids it trained on.

Several ranks: rank 0 draws the groups and sends them to every rank (`broadcast_object_list`); each rank
keeps its contiguous share, as the synchronous loop's `shard` cuts a batch, and trains on it; the
gradients are summed over the ranks as in the synchronous loop. Rank 0 alone talks to the rollout process and
pushes the weights. The step's record lists the prompt ids each rank trained on (`rank_prompt_ids`).
"""

import time

from . import distributed as dist_utils
from .prompt_ledger import PromptLedger
from .staleness import RolloutGroup, admitted, staleness_stats


class StaleFeedError(RuntimeError):
    """Every group the rollout process sends back is too stale to train: its engine is not on a recent version."""


class AsyncFeed:
    """Rank 0's side of the rollout process: prompts out, admitted groups in, the step's async metrics."""

    def __init__(self, rollout, ledger: PromptLedger, prompt_of, group_size: int, per_step: int, staleness: int,
                 seed: int):  # fmt: skip
        if staleness < 0:
            raise ValueError(f"async_staleness must be >= 0, got {staleness}")
        self.rollout, self.ledger, self.prompt_of = rollout, ledger, prompt_of
        self.G, self.per_step, self.K, self.seed = group_size, per_step, staleness, seed
        self.dropped_total, self._busy_seen = 0, 0.0

    def top_up(self) -> None:
        """Send prompts until (K + 1) · per_step are out with the rollout process (a group already read but not yet
        taken is still in flight: counted once)."""
        room = (self.K + 1) * self.per_step - self._out()
        for pid in self.ledger.issue(max(room, 0)):
            self.rollout.submit(pid, self.prompt_of(pid), self.G, self.seed)

    def _out(self) -> int:
        return len(self.rollout.in_flight | {g.prompt_id for g in self.rollout.groups})

    def next_batch(self, version: int) -> tuple[list[RolloutGroup], dict]:
        """`per_step` admitted groups for the optimizer step the trainer takes at `version`, and its metrics."""
        t0, wait0 = time.monotonic(), self.rollout.wait_s
        self.top_up()
        out = self._out()
        kept, dropped, stale = [], 0, []
        while len(kept) < self.per_step:
            group = self.rollout.next_group()
            if admitted(group, version, self.K):
                kept.append(group)
            else:
                dropped += 1
                stale.append(group.oldest_version)
                check_drops(stale, out, version, self.K)
                self.ledger.requeue([group.prompt_id])
                self.top_up()
        if self.K == 0:  # the synchronous order: the batch's prompts in stream order
            kept.sort(key=lambda g: g.prompt_id)
        self.dropped_total += dropped
        busy = max((g.meta.get("engine_busy_s", 0.0) for g in kept), default=self._busy_seen)
        metrics = {
            **staleness_stats(kept, version),
            "async_dropped_groups": float(dropped),
            "async_dropped_groups_total": float(self.dropped_total),
            "queue_depth": float(self.rollout.queue_depth()),
            "trainer_wait_s": self.rollout.wait_s - wait0,
            "generation_busy_s": max(busy - self._busy_seen, 0.0),
            "batch_s": time.monotonic() - t0,
        }
        self._busy_seen = max(busy, self._busy_seen)
        return kept, metrics


def check_drops(stale: list[int], out: int, version: int, staleness: int) -> None:
    """StaleFeedError once one batch has dropped more groups than were out when it began.

    The weights of `version` reach the rollout process before the batch is asked for, and they do not change while
    the trainer waits for it. So only the `out` groups already out when the batch began can hold tokens of an older
    version; a dropped prompt is sampled again from scratch under the engine's current version, and is admitted.
    A drop beyond `out` therefore means the engine is not sampling with a version >= version - staleness (the
    weight pushes do not reach it): without this bound the feed would drop and re-sample forever.
    """
    if len(stale) > out:
        raise StaleFeedError(
            f"the batch for trainer version {version} with async_staleness={staleness} dropped {len(stale)} groups as "
            f"too stale, their oldest tokens sampled by versions {sorted(set(stale))}: more than the {out} groups "
            f"out when the batch began, so the rollout engine is not sampling with a version >= "
            f"{version - staleness} (do the weight pushes reach it?)"
        )


def timeline(metrics: dict, step_s: float) -> dict:
    """Each side's busy / idle fractions of one step's wall time."""
    step_s = max(step_s, 1e-9)
    gen_busy = min(metrics["generation_busy_s"] / step_s, 1.0)
    trainer_idle = min(metrics["trainer_wait_s"] / step_s, 1.0)
    return {
        "generation_busy_frac": gen_busy,
        "generation_idle_frac": 1.0 - gen_busy,
        "trainer_busy_frac": 1.0 - trainer_idle,
        "trainer_idle_frac": trainer_idle,
    }


def dealt_prompt_ids(mine: list[RolloutGroup]) -> list[list[int]] | None:
    """Every rank's prompt ids of the step, in rank order (each rank gets the list); None on one process (also
    when a group of one is up: an in-process vLLM engine leaves its own behind)."""
    if dist_utils.world_size() == 1:
        return None
    import torch.distributed as dist

    shares = [None] * dist_utils.world_size()
    dist.all_gather_object(shares, [g.prompt_id for g in mine])
    return shares


def share_groups(groups: list[RolloutGroup] | None, dp_size: int, dp_rank: int) -> list[RolloutGroup]:
    """Every rank's share of rank 0's groups: its replica's contiguous slice, as `distributed.shard` cuts a batch
    (the ranks of one sequence-parallel group get the same groups)."""
    if dist_utils.world_size() == 1:
        return groups
    import torch.distributed as dist

    box = [groups]
    dist.broadcast_object_list(box, src=0)
    return dist_utils.shard(box[0], dp_size, dp_rank)
