"""The prompt ledger of asynchronous runs: each prompt trained exactly once across drops and resumes."""

import random

import pytest

from fastrl.trainer.prompt_ledger import PromptLedger


def test_issue_trains_requeues_and_resumes_without_loss_or_repeat():
    rng = random.Random(0)
    ledger, trained, in_flight = PromptLedger(), [], []
    for step in range(60):
        in_flight += ledger.issue(rng.randint(0, 4))
        rng.shuffle(in_flight)  # completions finish out of order
        k = rng.randint(0, len(in_flight))
        done, in_flight = in_flight[:k], in_flight[k:]
        dropped = done[: rng.randint(0, len(done) // 2)]
        ledger.requeue(dropped)  # too stale: sampled again
        ledger.trained(done[len(dropped) :])
        trained += done[len(dropped) :]
        if step % 7 == 6:  # SIGKILL + resume: what was in flight comes back
            ledger = PromptLedger.from_state(ledger.state_dict())
            in_flight = []
    owed = in_flight + ledger.issue(len(ledger.queued))  # the re-queued ids, no new one
    assert sorted(trained + owed) == list(range(ledger.next_id))  # every issued prompt exactly once
    assert len(trained) > 50


def test_watermark_compacts_the_trained_set():
    ledger = PromptLedger()
    ids = ledger.issue(5)
    ledger.trained([ids[1], ids[0], ids[3]])
    assert ledger.watermark == 2 and ledger.trained_above == {3}
    state = ledger.state_dict()
    assert state == {"next_id": 5, "watermark": 2, "trained_above": [3], "pending": [2, 4]}
    resumed = PromptLedger.from_state(state)
    assert resumed.issue(3) == [2, 4, 5]


def test_misuse_is_an_error():
    ledger = PromptLedger()
    ids = ledger.issue(2)
    ledger.trained(ids[:1])
    with pytest.raises(ValueError, match="already trained"):
        ledger.trained(ids[:1])
    with pytest.raises(ValueError, match="not in flight"):
        ledger.trained([7])
    with pytest.raises(ValueError, match="not in flight"):
        ledger.requeue([0])
    with pytest.raises(ValueError, match="inconsistent"):
        PromptLedger.from_state({"next_id": 2, "watermark": 1, "trained_above": [], "pending": [0]})
