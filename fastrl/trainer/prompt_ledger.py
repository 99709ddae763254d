"""Which prompts an asynchronous run has trained on and which are out with the rollout engine.

Completions finish out of order, so a stream position alone cannot say what a resumed run still owes. Prompt
ids are positions in the run's prompt stream (`PromptStream`): `issue` hands out the next ids (re-queued ones
first), `trained` / `requeue` settle them. The checkpointed state is the ids trained (a watermark below which
every id was trained, plus the ids above it) and the ids in flight; on load the in-flight ids are re-queued,
so a SIGKILL followed by `--resume` trains each prompt exactly once.
"""

from collections.abc import Iterable


class PromptLedger:
    def __init__(self, next_id: int = 0):
        if next_id < 0:
            raise ValueError(f"next_id must be >= 0, got {next_id}")
        self.next_id = next_id  # the first stream position never issued
        self.watermark = 0  # every id below it was trained
        self.trained_above: set[int] = set()  # trained ids >= watermark
        self.in_flight: set[int] = set()
        self.queued: list[int] = []  # ids to issue again before new ones (dropped or in flight at a checkpoint)

    def issue(self, n: int) -> list[int]:
        """`n` prompt ids to sample: re-queued ones first, then new stream positions."""
        if n < 0:
            raise ValueError(f"cannot issue {n} prompts")
        take, self.queued = self.queued[:n], self.queued[n:]
        new = list(range(self.next_id, self.next_id + n - len(take)))
        self.next_id += len(new)
        self.in_flight.update(take + new)
        return take + new

    def trained(self, ids: Iterable[int]) -> None:
        """Record `ids` as trained on; ValueError for an id not in flight (trained twice, or never issued)."""
        for i in ids:
            if i not in self.in_flight:
                state = "already trained" if self.was_trained(i) else "not in flight"
                raise ValueError(f"prompt id {i} is {state}")
            self.in_flight.discard(i)
            self.trained_above.add(i)
        while self.watermark in self.trained_above:
            self.trained_above.discard(self.watermark)
            self.watermark += 1

    def requeue(self, ids: Iterable[int]) -> None:
        """Give in-flight `ids` back (a dropped group): they are issued again before any new prompt."""
        ids = list(ids)
        for i in ids:
            if i not in self.in_flight:
                raise ValueError(f"prompt id {i} is not in flight")
            self.in_flight.discard(i)
        self.queued = ids + self.queued

    def was_trained(self, i: int) -> bool:
        return i < self.watermark or i in self.trained_above

    def state_dict(self) -> dict:
        """The checkpointed state: trained ids, and in-flight plus queued ids (all to be issued again)."""
        return {
            "next_id": self.next_id,
            "watermark": self.watermark,
            "trained_above": sorted(self.trained_above),
            "pending": sorted(self.in_flight) + [i for i in self.queued if i not in self.in_flight],
        }

    @classmethod
    def from_state(cls, state: dict) -> "PromptLedger":
        """The ledger of a resumed run: what was in flight at the checkpoint is queued to be sampled again."""
        ledger = cls(int(state["next_id"]))
        ledger.watermark = int(state["watermark"])
        ledger.trained_above = {int(i) for i in state["trained_above"]}
        ledger.queued = [int(i) for i in state["pending"]]
        clash = [i for i in ledger.queued if ledger.was_trained(i)]
        if clash or any(i >= ledger.next_id for i in ledger.queued):
            raise ValueError(f"prompt ledger state is inconsistent: pending ids {ledger.queued} vs trained / next_id")
        return ledger
