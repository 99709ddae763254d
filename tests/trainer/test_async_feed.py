"""The trainer's feed of asynchronous rollouts against a scripted rollout process (no engine)."""

import threading

import pytest

from fastrl.trainer import async_feed
from fastrl.trainer.async_feed import AsyncFeed, StaleFeedError, timeline
from fastrl.trainer.prompt_ledger import PromptLedger
from fastrl.trainer.staleness import RolloutGroup, VersionSpan


class ScriptedRollout:
    """Samples each prompt at the version current when it was submitted; finishes them in `finish_order`."""

    def __init__(self, finish_order):
        self.version, self.in_flight, self.groups, self.wait_s = 0, set(), [], 0.0
        self.sampled_at, self.submitted, self.finish_order = {}, [], finish_order

    def submit(self, prompt_id, prompt_ids, n, seed):
        assert prompt_id not in self.in_flight
        self.in_flight.add(prompt_id)
        self.sampled_at[prompt_id] = self.version
        self.submitted.append(prompt_id)

    def next_group(self):
        pid = next(iter(self.finish_order(sorted(self.in_flight), self.version)))
        self.in_flight.discard(pid)
        v = self.sampled_at[pid]
        return RolloutGroup(pid, [1], [[4, 5]], [[-1.0, -1.0]], [(VersionSpan(v, 0, 2),)], [False])

    def queue_depth(self):
        return 0


def feed(rollout, K, per_step=2):
    return AsyncFeed(rollout, PromptLedger(), lambda pid: [pid], group_size=1, per_step=per_step, staleness=K, seed=0)


def test_staleness_zero_is_the_synchronous_order():
    rollout = ScriptedRollout(lambda ids, version: reversed(ids))  # completions finish last-submitted first
    f = feed(rollout, K=0)
    for version in range(3):
        rollout.version = version
        groups, metrics = f.next_batch(version)
        assert [g.prompt_id for g in groups] == [2 * version, 2 * version + 1]  # stream order, one step out
        assert metrics["staleness_max"] == 0.0 and metrics["async_dropped_groups"] == 0.0
    assert rollout.submitted == list(range(6))


def test_stale_groups_are_dropped_counted_and_sampled_again():
    # prompt 0 finishes only at version 2: two versions after the one that sampled it
    rollout = ScriptedRollout(lambda ids, version: ([0] if version >= 2 and 0 in ids else []) + [i for i in ids if i])
    f = feed(rollout, K=1)
    seen = []
    for version in range(4):
        rollout.version = version
        groups, metrics = f.next_batch(version)
        assert metrics["staleness_max"] <= 1
        seen += [g.prompt_id for g in groups]
        f.ledger.trained(g.prompt_id for g in groups)
    assert rollout.submitted[:4] == [0, 1, 2, 3]  # (K + 1) * per_step out at once
    assert f.dropped_total == 1 and rollout.submitted.count(0) == 2  # dropped at version 2, sampled again
    assert rollout.sampled_at[0] == 2 and 0 in seen
    assert len(seen) == len(set(seen)) == 8


class FrozenRollout(ScriptedRollout):
    """An engine the weight pushes never reach: it samples every prompt with version 0, forever."""

    def __init__(self):
        super().__init__(lambda ids, version: ids)
        self.closed = False

    def next_group(self):
        if self.closed:  # ends a feed left spinning by a test that failed
            raise RuntimeError("closed")
        return super().next_group()


def test_a_feed_whose_groups_are_all_too_stale_raises_instead_of_spinning():
    """At K = 0 and trainer version 3 every group comes back sampled by version 0: each is dropped and sampled again,
    which without a bound never ends. The feed raises once it has dropped more groups than were out."""
    rollout = FrozenRollout()
    f = feed(rollout, K=0)
    result = {}

    def ask():
        try:
            result["batch"] = f.next_batch(3)
        except Exception as e:
            result["error"] = e

    worker = threading.Thread(target=ask, daemon=True)
    worker.start()
    worker.join(10)
    rollout.closed = True
    assert not worker.is_alive(), "next_batch still waits after 10 s: it drops and re-samples the stale groups forever"
    error = result.get("error")
    assert isinstance(error, StaleFeedError), result
    message = str(error)
    assert "trainer version 3" in message and "async_staleness=0" in message and "versions [0]" in message
    assert "dropped 3 groups" in message and "the 2 groups out" in message
    assert len(rollout.submitted) == 2 + 2  # the 2 out, then 2 of the 3 dropped sampled again before it gave up


def test_drop_bound_is_the_groups_out_when_the_batch_began():
    async_feed.check_drops([0, 0], out=2, version=1, staleness=0)  # each group out may come back stale once
    with pytest.raises(StaleFeedError, match=r"async_staleness=1 dropped 3 groups as too stale, their oldest tokens "
                                             r"sampled by versions \[0, 1\]"):  # fmt: skip
        async_feed.check_drops([0, 1, 0], out=2, version=3, staleness=1)


def test_groups_read_but_not_taken_count_once():
    """The rollout client keeps a group it read while waiting for something else (a weight push's answer) in
    `groups` and in `in_flight` until the feed takes it: counted twice, the feed would keep fewer prompts out."""
    rollout = ScriptedRollout(lambda ids, version: ids)
    f = feed(rollout, K=1)  # 4 out
    f.top_up()
    rollout.in_flight -= {0, 1}  # taken by the last batch
    rollout.groups = [rollout.next_group(), rollout.next_group()]  # 2 and 3: read, not yet taken
    rollout.in_flight |= {2, 3}
    f.top_up()
    assert rollout.submitted == [0, 1, 2, 3, 4, 5]


def test_timeline_fractions():
    t = timeline({"generation_busy_s": 3.0, "trainer_wait_s": 1.0}, step_s=4.0)
    assert t == {"generation_busy_frac": 0.75, "generation_idle_frac": 0.25, "trainer_busy_frac": 0.75,
                 "trainer_idle_frac": 0.25}  # fmt: skip
