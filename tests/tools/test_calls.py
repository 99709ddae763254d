"""Tool-call parsing (code blocks, Hermes / Qwen ``<tool_call>``), observation truncation and user tools."""

from __future__ import annotations

import pytest

from fastrl.tools import ToolResult
from fastrl.tools.calls import (
    ToolCall,
    call_tool,
    last_python_block,
    output_block,
    parse_tool_calls,
    tool_schema,
    truncate_observation,
)


def test_the_last_unanswered_python_block_is_the_call():
    text = "Let me compute.\n```python\nprint(123 * 456)\n```"
    assert last_python_block(text) == ToolCall("python", {"code": "print(123 * 456)\n"})
    answered = text + output_block("56088") + "So 56088.\n```python\nprint(2 ** 10)\n```"
    assert last_python_block(answered) == ToolCall("python", {"code": "print(2 ** 10)\n"})
    assert output_block("56088") == "\n```output\n56088\n```\n"


@pytest.mark.parametrize(
    "text",
    [
        "no code here",
        "```python\nprint(1)",  # not closed yet: the sampler has not stopped on the fence
        "```python\nprint(1)\n```\n```output\n1\n```\nThe answer is 1.",
        "```py\nprint(1)\n```",
    ],
    ids=["no-block", "unclosed", "answered", "other-language"],
)
def test_nothing_to_run(text):
    assert last_python_block(text) is None


def test_hermes_calls_parse_in_order_and_bad_ones_become_errors():
    text = (
        '<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>'
        '<tool_call>{"name": "lookup", "arguments": "{\\"key\\": 3}"}</tool_call>'
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call>'
    )
    calls = parse_tool_calls(text)
    assert calls[:2] == [ToolCall("python", {"code": "print(1)"}), ToolCall("lookup", {"key": 3})]
    assert calls[2].name is None and "not valid JSON" in calls[2].error
    assert calls[3].name is None and '{"name": str' in calls[3].error
    assert parse_tool_calls("plain text") == []


@pytest.mark.parametrize("length", [0, 256, 257, 1000, 123_457], ids=lambda n: f"len{n}")
def test_truncation_keeps_head_and_tail_within_the_cap(length):
    text = "".join(chr(ord("a") + i % 26) for i in range(length))
    cut = truncate_observation(text)
    assert len(cut) <= 256
    if length <= 256:
        assert cut == text
        return
    assert len(cut) == 256
    head, tail = cut.split("\n...[")[0], cut.split("chars cut]...\n")[1]
    assert text.startswith(head) and text.endswith(tail) and abs(len(head) - len(tail)) <= 1
    assert f"[{length - len(head) - len(tail)} chars cut]" in cut


def test_bad_truncation_cap_is_named():
    with pytest.raises(ValueError, match=r"max_chars must be an int >= 32 \(room for the marker\), got 8"):
        truncate_observation("x" * 100, 8)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def test_user_tools_are_called_and_their_errors_are_observations():
    assert call_tool(multiply, {"a": 123, "b": 456}) == ToolResult("56088", "ok")
    bad = call_tool(multiply, {"a": 1})
    assert bad.status == "error" and "missing a required argument: 'b'" in bad.output
    failing = call_tool(lambda x: 1 / x, {"x": 0})
    assert failing == ToolResult("ZeroDivisionError: division by zero", "error")


def test_schema_comes_from_signature_and_docstring():
    schema = tool_schema(multiply)
    assert schema["function"]["name"] == "multiply"
    assert schema["function"]["parameters"]["properties"]["a"] == {"type": "integer", "description": "the first factor"}
    assert schema["function"]["parameters"]["required"] == ["a", "b"]
