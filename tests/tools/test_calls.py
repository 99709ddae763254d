"""Tool-call parsing (code blocks, Hermes / Qwen ``<tool_call>``), observation truncation and user tools."""

from __future__ import annotations

import pytest
from transformers.utils.chat_parsing import parse_response

from fastrl.tools import ToolResult
from fastrl.tools.calls import (
    HERMES_RESPONSE_TEMPLATE,
    HERMES_START,
    ToolCall,
    call_tool,
    hermes_call,
    last_python_block,
    output_block,
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


LOOKUP = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {
    "key": {"type": "integer"}, "note": {"type": "string"}}}}}  # fmt: skip
# a Qwen prompt: its system turn shows a call that is not JSON, before the assistant turn starts
PROMPT = '<|im_start|>system\n<tool_call>\n{"name": <function-name>}\n</tool_call><|im_end|>\n' + HERMES_START


@pytest.mark.parametrize(
    "text",
    [
        'Let me look.\n<tool_call>\n{"name": "lookup", "arguments": {"key": "7", "note": "7"}}\n</tool_call>',
        '<tool_call>{"name": "lookup", "arguments": {"key": 3}}</tool_call>\n',
        '<think>\nhm</think>\n<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>',
    ],
    ids=["content-then-call", "call-then-newline", "after-thinking"],
)
def test_a_hermes_call_is_what_parse_response_reads(text):
    """The call equals transformers' parse_response on the same text and prefix (arguments typed by the schema)."""
    parsed = parse_response(text, HERMES_RESPONSE_TEMPLATE, prefix=PROMPT, tools=[LOOKUP])["tool_calls"]
    assert len(parsed) == 1 and hermes_call(text, prefix=PROMPT, tools=[LOOKUP]) == ToolCall(**parsed[0]["function"])
    if "note" in text:  # the integer parameter's "7" is cast, the string one's kept
        assert hermes_call(text, prefix=PROMPT, tools=[LOOKUP]).arguments == {"key": 7, "note": "7"}


def test_only_the_first_closed_hermes_call_counts():
    first = '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
    assert hermes_call(first + ' <tool_call>{"name": "b", "arguments": {}}</tool_call>', prefix="") == ToolCall("a", {})
    for open_only in ("plain text", "<tool_call>", '<tool_call>{"name": "a", "argu', "x</tool_call>"):
        assert hermes_call(open_only, prefix=PROMPT) is None, open_only


def test_a_call_inside_the_thinking_the_prompt_opened_is_thinking():
    """The prefix decides: after a template's `<think>` a mentioned call is reasoning; without it, a call."""
    mention = 'I could write <tool_call>{"name": "a", "arguments": {}}</tool_call> but'
    assert hermes_call(mention, prefix=PROMPT + "<think>\n") is None
    assert hermes_call(mention, prefix=PROMPT) == ToolCall("a", {})
    then = mention + ' no.</think>\n<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    assert hermes_call(then, prefix=PROMPT + "<think>\n") == ToolCall("b", {})


def test_malformed_hermes_calls_are_errors_not_exceptions():
    bad = hermes_call("<tool_call>{not json}</tool_call>", prefix=PROMPT)
    assert bad.name is None and "not valid JSON" in bad.error and "{not json}" in bad.error
    nameless = hermes_call('<tool_call>{"arguments": {}}</tool_call>', prefix=PROMPT)
    assert nameless.name is None and '{"name": str' in nameless.error
    listed = hermes_call("<tool_call>[1, 2]</tool_call>", prefix=PROMPT)
    assert listed.name is None and "[1, 2]" in listed.error
    as_string = '<tool_call>{"name": "lookup", "arguments": "{\\"key\\": 3}"}</tool_call>'
    assert hermes_call(as_string, prefix=PROMPT) == ToolCall("lookup", {"key": 3})
    with pytest.raises(TypeError, match="text and prefix must be str, got str and NoneType"):
        hermes_call("x", prefix=None)


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


def test_hermes_calls_need_transformers_response_parser(monkeypatch):
    import transformers

    monkeypatch.setattr(transformers, "__version__", "5.10.4")
    with pytest.raises(ImportError, match=r"transformers >= 5.15\); transformers 5.10.4 is installed"):
        hermes_call("<tool_call>{}</tool_call>", prefix="")
