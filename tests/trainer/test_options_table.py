"""docs/trainer.md's table of option pairs against the validator: a refused pair is refused with an error naming
both options, a pair that works or is untested is accepted, and a working pair's test exists; a pair credited to a
launch of many options at once (the synchronous one, the asynchronous one) is on in that launch, which plants a bug
for each of its options."""

import importlib
import itertools
import os
import re
import sys

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
# each launch that runs many options at once: its folder under tests/ and the module with its config, world and plants
LAUNCHES = {
    "tests/distributed/test_options_together.py::test_every_option_at_once_takes_the_one_process_steps": (
        "distributed",
        "test_options_together",
    ),
    "tests/rollout_vllm/test_async_options_together.py::test_async_every_option_takes_the_one_process_steps": (
        "rollout_vllm",
        "async_launch",
    ),
}
# whether an option is on in a launch: its config and its world size
ON = {
    "async K>=1": lambda c, world: c.async_staleness >= 1,
    "chunks": lambda c, world: c.async_staleness >= 0 and c.rollout_chunk_tokens > 0,
    "replay": lambda c, world: c.sampler_replay == "on" and (c.top_p < 1 or c.top_k > 0),
    "sequence parallel": lambda c, world: c.sequence_parallel > 1,
    "fsdp": lambda c, world: c.fsdp,
    "data parallel": lambda c, world: world // c.sequence_parallel > 1,
    "thinking budget": lambda c, world: c.thinking_budget > 0,
    "steps": lambda c, world: c.ppo_epochs * c.minibatches > 1,
    "checkpointing": lambda c, world: c.gradient_checkpointing,
    "packing": lambda c, world: c.packing == "on",
    "beta": lambda c, world: c.loss.beta > 0,
    "is_cap": lambda c, world: c.loss.is_cap is not None,
}


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


@pytest.mark.parametrize("node", LAUNCHES, ids=lambda node: node.split("::")[0].rsplit("/", 1)[-1])
def test_the_launch_turns_on_and_plants_each_option_it_is_credited_with(node):
    folder, module = LAUNCHES[node]
    sys.path.insert(0, os.path.join(ROOT, "tests", folder))
    try:
        launch = importlib.import_module(module)
    finally:
        sys.path.pop(0)
    config = launch.config("unused", **launch.LAUNCH)
    credited = {option for row in table_rows() if row[3] == node for option in row[:2]}
    assert credited, "no pair names the launch"
    for option in sorted(credited):
        assert option in ON and ON[option](config, launch.WORLD), f"the table credits the launch with {option}"
        assert option in launch.PLANTS, f"the launch plants no bug in {option}"


def test_check_world_refuses_a_world_the_config_cannot_split():
    check_world(make_config("tiny", sequence_parallel=2), 4)  # two replicas of two ranks each
    with pytest.raises(ConfigError, match=r"sequence_parallel.*3.*world size 4"):
        check_world(make_config("tiny", sequence_parallel=3), 4)
    with pytest.raises(ConfigError, match=r"fsdp.*1"):
        check_world(make_config("tiny", fsdp=True), 1)
