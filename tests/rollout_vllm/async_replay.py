"""The one-process reference of an asynchronous launch, on the launch's own groups.

Which version sampled each group depends on timing, so a reference cannot sample its own: the launch's rank 0
records every group it takes from the rollout process (`async_launch.py`), and `replay_reference` runs the same
asynchronous loop (feed, admission, ledger, scoring) in one process on them, with a stand-in for the rollout
process that hands them out in that order and checks each was asked for, with the same prompt. `behaviour_gap`
checks the groups against the weights: each token's behaviour log-prob is its log-prob under the version that
sampled it.
"""

import pytest
import torch

from fastrl.trainer import trainer
from fastrl.trainer.batching import Sample
from fastrl.trainer.build import build_model
from fastrl.trainer.metrics import read_metrics
from fastrl.trainer.rollout import async_client, weight_push
from fastrl.trainer.staleness import token_versions
from fastrl.trainer.update import StepSettings, sequence_logprobs


class Replayed:
    """The rollout process's stand-in: the launch's groups, in the order its rank 0 took them."""

    def __init__(self, taken: list):
        self.taken, self.asked, self.in_flight, self.groups, self.wait_s = list(taken), {}, set(), [], 0.0

    def start(self) -> "Replayed":
        return self

    def submit(self, prompt_id: int, prompt_ids: list[int], n: int, seed: int, **options) -> None:
        self.asked[prompt_id] = list(prompt_ids)
        self.in_flight.add(prompt_id)

    def next_group(self):
        group = self.taken.pop(0)
        assert self.asked.get(group.prompt_id) == group.prompt_ids and group.prompt_id in self.in_flight, (
            f"the reference did not ask for prompt {group.prompt_id}"
        )
        self.in_flight.discard(group.prompt_id)
        return group

    def queue_depth(self) -> int:
        return 0

    def close(self) -> None:
        pass


class Versions:
    """The weight push's stand-in: it keeps the weights of every version pushed, in `Versions.weights`."""

    weights: dict[int, dict] = {}

    def __init__(self, rollout, model, rank: int = 0):
        self.model = model

    def push(self, version: int) -> None:
        Versions.weights[version] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}


def replay_reference(config, taken: list) -> tuple[list[dict], dict[int, dict]]:
    """`config`'s run (one process) on the groups `taken`: its metrics rows and the weights of every version."""
    replayed = Replayed(taken)
    Versions.weights = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(async_client, "AsyncRollout", lambda spec, **kwargs: replayed)
        mp.setattr(weight_push, "WeightPush", Versions)
        trainer.train(config)
    assert not replayed.taken, f"{len(replayed.taken)} of the launch's groups left untaken"
    return read_metrics(config.output_dir), Versions.weights


def behaviour_gap(groups: list, weights: dict[int, dict], config, chunk: int) -> tuple[float, int, int]:
    """(largest |behaviour log-prob - log-prob under the sampling version's weights|, tokens checked, pieces that
    crossed a version) over the groups' sampled tokens. A piece is prefilled under its first token's version; tokens
    after a weight update inside it attend to keys the older weights computed, so they are left out (pieces are
    `chunk` tokens, the last shorter; a completion cut by a thinking budget is all one version at K = 0)."""
    model, tokenizer = build_model(config, torch.device("cpu"))
    settings = StepSettings(config.loss, 1 << 20, False, tokenizer.pad_token_id, impl="torch", bf16=False)
    comps = []
    for g in groups:
        inserted = g.inserted or [()] * len(g.completion_ids)
        for ids, lps, spans, cut in zip(g.completion_ids, g.logprobs, g.spans, inserted):
            skip = {t for span in cut for t in range(span.start, span.end)}
            comps.append((g.prompt_ids, ids, lps, token_versions(spans), skip))
    under = {}  # version -> every completion's log-probs under its weights
    for v in sorted({v for c in comps for v in c[3]}):
        model.load_state_dict(weights[v])
        under[v] = sequence_logprobs(model.eval(), [Sample(p, ids, 0.0) for p, ids, *_ in comps], settings)
    gap, checked, crossed = 0.0, 0, 0
    for i, (_, ids, lps, versions, skip) in enumerate(comps):
        for t, (lp, v) in enumerate(zip(lps, versions)):
            crossed += t % chunk == 0 and len(set(versions[t : t + chunk])) > 1
            if v == versions[t - t % chunk] and t not in skip:
                gap, checked = max(gap, abs(lp - under[v][i][t])), checked + 1
    return gap, checked, crossed
