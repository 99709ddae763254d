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
