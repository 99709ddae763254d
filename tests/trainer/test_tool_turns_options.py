"""The tool options at config time: each bad value and each refused pair named in the error."""

import pytest

from fastrl.trainer.config import ConfigError, check_world, make_config
from fastrl.trainer.tool_options import resolve_tools


def word_count(text: str) -> int:
    """Words in `text`.

    Args:
        text: the text to count.
    """
    return len(text.split())


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(tools="pyhton"), "tools"),
        (dict(tools="python,python"), "tools"),
        (dict(tools="no_such_module_x:fn"), "tools"),
        (dict(tools="os:sep"), "tools"),
        (dict(tools="python", max_tool_calls=-1), "max_tool_calls"),
        (dict(tools="python", tool_timeout_s=0.0), "tool_timeout_s"),
        (dict(tools="python", tool_memory_mb=8), "tool_memory_mb"),
        (dict(tools="python", tool_format="json"), "tool_format"),
        (dict(tools="python", tool_format="hermes"), "tool_format"),
        (dict(tools=f"{__name__}:word_count"), "tools"),
        (dict(tools="python", thinking_budget=4), "thinking_budget"),
        (dict(tools="python", engine="vllm", async_staleness=0), "async_staleness"),
        (dict(tools="python", sequence_parallel=2), "sequence_parallel"),
        (dict(tools="python", fsdp=True), "fsdp"),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={w}" for k, w in v.items()),
)
def test_bad_tool_settings_are_refused_by_name(overrides, field):
    with pytest.raises(ConfigError, match=field):
        make_config("tiny", **overrides)


def test_tools_refuse_data_parallel_at_start_up():
    config = make_config("tiny", tools="python")
    check_world(config, 1)
    with pytest.raises(ConfigError, match="tools"):
        check_world(config, 2)


def test_user_tools_resolve_from_the_spec_and_from_python():
    config = make_config("tiny", tools=f"python,{__name__}:word_count", tool_format="hermes", chat_template=True)
    tools = resolve_tools(config.tools)
    assert tools == {"python": None, "word_count": word_count}

    def lookup(key: str) -> str:
        return key.upper()

    assert resolve_tools("python", [lookup]) == {"python": None, "lookup": lookup}
    with pytest.raises(ValueError, match="word_count"):
        resolve_tools(f"{__name__}:word_count", [word_count])


def test_train_takes_module_level_functions_as_tools_and_checks_them_as_flags(monkeypatch, tmp_path):
    """`train(config, tools=[fn])` (TRL's `tools=`) runs `fn` as `--tools module:fn` would: the config the run
    builds names it, so every check sees it; a lambda or a nested function is refused naming it, before anything
    is built; a pair refused with tools is refused with tools given from Python too."""
    from fastrl.trainer import trainer as loop

    built = []

    def stop(config):
        built.append(config)
        raise KeyboardInterrupt  # the run is built from here on: the test has what it came for

    monkeypatch.setattr(loop, "start_run", stop)
    hermes = dict(output_dir=str(tmp_path), tool_format="hermes", chat_template=True)
    with pytest.raises(KeyboardInterrupt):
        loop.train(make_config("tiny", tools="python", **hermes), tools=[word_count])
    assert built[0].tools == f"python,{__name__}:word_count"
    assert resolve_tools(built[0].tools) == {"python": None, "word_count": word_count}

    def nested(text: str) -> int:
        return 0

    for bad in (lambda text: 0, nested):
        with pytest.raises(ConfigError) as e:
            loop.train(make_config("tiny", **hermes), tools=[bad])
        assert e.value.field == "tools" and "module-level function" in str(e.value)
    with pytest.raises(ConfigError) as e:
        loop.train(make_config("tiny", thinking_budget=4, **hermes), tools=[word_count])
    assert e.value.field == "thinking_budget" and "refused with tools" in str(e.value)
    assert len(built) == 1
