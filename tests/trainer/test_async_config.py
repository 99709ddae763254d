"""The settings of asynchronous rollouts: vLLM only, and what they cannot be combined with."""

import pytest

from fastrl.trainer.cli import main
from fastrl.trainer.config import ConfigError, make_config


@pytest.mark.parametrize(
    "overrides, field",
    [
        pytest.param(dict(engine="hf", async_staleness=1), "async_staleness", id="hf-engine"),
        pytest.param(dict(engine="auto", async_staleness=0), "async_staleness", id="auto-engine"),
        pytest.param(dict(engine="vllm", async_staleness=1, minibatches=2), "async_staleness", id="two-steps"),
        pytest.param(dict(engine="vllm", rollout_chunk_tokens=4), "rollout_chunk_tokens", id="chunks-without-async"),
        pytest.param(dict(engine="vllm", async_staleness=-2), "async_staleness", id="below-minus-one"),
        pytest.param(dict(engine="vllm", async_staleness=0, rollout_timeout_s=0), "rollout_timeout_s", id="timeout"),
    ],
)
def test_refused_settings_name_the_field(overrides, field):
    with pytest.raises(ConfigError) as e:
        make_config("tiny", **overrides)
    assert e.value.field == field


def test_accepted_settings_and_the_help_text(capsys):
    c = make_config("tiny", engine="vllm", async_staleness=1, rollout_chunk_tokens=4)
    assert (c.async_staleness, c.rollout_chunk_tokens, c.rollout_timeout_s) == (1, 4, 600.0)
    assert make_config("tiny", engine="vllm", async_staleness=0, minibatches=2).minibatches == 2  # K = 0: as today
    # the rollout process applies the thinking budget, its pieces' tokens counted together
    c = make_config("tiny", engine="vllm", async_staleness=1, rollout_chunk_tokens=2, thinking_budget=4)
    assert (c.thinking_budget, c.rollout_chunk_tokens) == (4, 2)
    c = make_config("tiny", engine="vllm", async_staleness=1, fsdp=True, sequence_parallel=2)  # checked at launch
    assert (c.fsdp, c.sequence_parallel) == (True, 2)
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--async-staleness" in text and "not HF" in text and "--rollout-chunk-tokens" in text


def test_rollout_cpus_setting_pins_the_process_or_names_the_bad_value():
    import os

    import torch

    from fastrl.trainer.rollout.process_setup import pin_cpus

    with pytest.raises(ValueError, match="FASTRL_ROLLOUT_CPUS='0;1'"):
        pin_cpus("0;1")
    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        pin_cpus(str(min(cores)))
        assert os.sched_getaffinity(0) == {min(cores)} and torch.get_num_threads() == 1
    finally:
        os.sched_setaffinity(0, cores)
        torch.set_num_threads(threads)


def test_several_steps_per_batch_need_staleness_zero_or_one_batch_of_steps():
    """K counts optimizer steps: a K between 1 and the batch's step count would drop every group sampled ahead."""
    with pytest.raises(ConfigError) as e:
        make_config("tiny", engine="vllm", async_staleness=3, ppo_epochs=2, minibatches=2)
    assert e.value.field == "async_staleness" and "ppo_epochs=2" in str(e.value) and "minibatches=2" in str(e.value)
    for K in (0, 4):
        c = make_config("tiny", engine="vllm", async_staleness=K, ppo_epochs=2, minibatches=2)
        assert (c.async_staleness, c.ppo_epochs * c.minibatches) == (K, 4)
