"""docs/trainer.md's table of option pairs against the validator: a refused pair is refused with an error naming
both options, a pair that works or is untested is accepted, and a working pair's test exists."""

import itertools
import os
import re

import pytest

from fastrl.trainer.config import ConfigError, check_world, make_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# each option: the settings that turn it on, and the names its refusals may call it by
OPTIONS = {
    "async K=0": (dict(engine="vllm", async_staleness=0), ("async_staleness",)),
    "async K>=1": (dict(engine="vllm", async_staleness=2), ("async_staleness",)),
    "chunks": (
        dict(engine="vllm", async_staleness=2, rollout_chunk_tokens=4),
        ("rollout_chunk_tokens", "async_staleness"),
    ),
    "replay": (dict(top_p=0.9, sampler_replay="on"), ("sampler_replay",)),
    "sequence parallel": (dict(sequence_parallel=2), ("sequence_parallel",)),
    "fsdp": (dict(fsdp=True), ("fsdp",)),
    "data parallel": ({}, ("data parallel", "world")),
    "thinking budget": (dict(thinking_budget=4), ("thinking_budget",)),
    "steps": (dict(minibatches=2), ("minibatches", "ppo_epochs")),
    "checkpointing": (dict(gradient_checkpointing=True), ("gradient_checkpointing",)),
    "packing": (dict(packing="on"), ("packing",)),
    "beta": (dict(beta=0.05), ("beta",)),
    "is_cap": (dict(is_cap=2.0), ("is_cap",)),
    "rollout gpus": (
        dict(engine="vllm", async_staleness=0, rollout_gpus="1", device="cuda"),
        ("rollout_gpus", "async_staleness"),
    ),
    "tools": (dict(tools="python"), ("tools",)),
}
VALUES_OF_ONE = {frozenset(("async K=0", "async K>=1"))}


def table_rows() -> list[tuple[str, str, str, str]]:
    with open(os.path.join(ROOT, "docs", "trainer.md"), encoding="utf-8") as f:
        text = f.read()
    body = text.split("<!-- options-table: start -->")[1].split("<!-- options-table: end -->")[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in body.strip().splitlines()]
    return [tuple(r) for r in rows[2:]]  # past the header and its rule


def verdict(a: str, b: str) -> str | None:
    """The validator's word on the pair: None when accepted, else the error's text."""
    (set_a, _), (set_b, _) = OPTIONS[a], OPTIONS[b]
    try:
        config = make_config("tiny", **{**set_a, **set_b})
        if "data parallel" in (a, b):
            check_world(config, 2 * config.sequence_parallel)  # two replicas
    except ConfigError as e:
        return str(e)
    return None


def test_every_pair_is_in_the_table_once():
    pairs = [frozenset(r[:2]) for r in table_rows()]
    want = {frozenset(p) for p in itertools.combinations(OPTIONS, 2)} - VALUES_OF_ONE
    assert len(pairs) == len(set(pairs)) and set(pairs) == want, sorted(map(sorted, want ^ set(pairs)))


@pytest.mark.parametrize("row", table_rows(), ids=lambda r: f"{r[0]}-x-{r[1]}".replace(" ", "_"))
def test_the_table_and_the_validator_agree(row):
    a, b, said, where = row
    assert said in ("works", "refused", "untested"), row
    got = verdict(a, b)
    if said == "refused":
        assert got is not None, f"the table refuses {a} x {b}; the validator accepts it"
        for option in (a, b):  # the error names both options
            assert any(name in got for name in OPTIONS[option][1]), (option, got)
        return
    assert got is None, f"the table says {a} x {b} {said}; the validator refuses it: {got}"
    if said == "works":
        path, _, name = where.partition("::")
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            assert re.search(rf"^def {re.escape(name)}\(", f.read(), re.M), where


def test_check_world_refuses_a_world_the_config_cannot_split():
    check_world(make_config("tiny", sequence_parallel=2), 4)  # two replicas of two ranks each
    with pytest.raises(ConfigError, match=r"sequence_parallel.*3.*world size 4"):
        check_world(make_config("tiny", sequence_parallel=3), 4)
    with pytest.raises(ConfigError, match=r"fsdp.*1"):
        check_world(make_config("tiny", fsdp=True), 1)
