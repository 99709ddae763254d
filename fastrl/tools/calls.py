"""Tool calls as models write them, their observations, and user tools as plain functions.

Two formats, as the ecosystem writes them:

- raw prompts (ToRL, SimpleTIR): a fenced ```` ```python ```` block is the call; the sampler stops at its closing
  fence, the tool runs, and the observation follows as a ```` ```output ```` block (``output_block``);
- chat models (Hermes, Qwen): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; the observation goes
  back as a ``tool`` message through the tokenizer's chat template.

A malformed call is not an exception: it comes back as a ``ToolCall`` with ``error`` set, which the rollout turns
into an observation (the model sees what it got wrong), never a crash.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .sandbox import ToolResult

__all__ = [
    "OBSERVATION_CHARS",
    "ToolCall",
    "call_tool",
    "last_python_block",
    "output_block",
    "parse_tool_calls",
    "tool_schema",
    "truncate_observation",
]

# verl's default cap on a tool's observation (characters).
OBSERVATION_CHARS = 256
_PYTHON_BLOCK = re.compile(r"```python[ \t]*\n(.*?)```", re.DOTALL)
_OUTPUT_OPEN = re.compile(r"\s*```output\b")
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One call parsed from a completion.

    Attributes:
        name: the tool's name ("python" for a code block); None when the call could not be parsed.
        arguments: keyword arguments for the tool ({"code": ...} for a code block).
        error: why the call is malformed, or None; a malformed call's observation is this text.
    """

    name: str | None
    arguments: dict[str, Any]
    error: str | None = None


def last_python_block(text: str) -> ToolCall | None:
    """The code of the last complete ```` ```python ```` block that has no ```` ```output ```` block after it yet.

    A sampler that stops on the closing fence leaves the block last in ``text``; None means there is nothing to run
    (no block, an unclosed one, or the last one already answered).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    blocks = list(_PYTHON_BLOCK.finditer(text))
    if not blocks or _OUTPUT_OPEN.match(text, blocks[-1].end()):
        return None
    return ToolCall(name="python", arguments={"code": blocks[-1].group(1)})


def output_block(observation: str) -> str:
    """The observation as the raw-prompt format appends it after a code block."""
    if not isinstance(observation, str):
        raise TypeError(f"observation must be a str, got {type(observation).__name__}")
    return f"\n```output\n{observation}\n```\n"


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>{json}</tool_call>`` in ``text``, in order (Hermes / Qwen chat templates)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    calls = []
    for match in _TOOL_CALL.finditer(text):
        body = match.group(1).strip()
        try:
            call = json.loads(body)
        except ValueError as error:
            calls.append(ToolCall(None, {}, f"the tool call is not valid JSON ({error}): {body[:80]!r}"))
            continue
        name = call.get("name") if isinstance(call, dict) else None
        arguments = call.get("arguments", {}) if isinstance(call, dict) else None
        if isinstance(arguments, str):  # some templates carry the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            error = 'a tool call must be {"name": str, "arguments": object}'
            calls.append(ToolCall(None, {}, f"{error}, got {body[:80]!r}"))
            continue
        calls.append(ToolCall(name, arguments))
    return calls


def truncate_observation(text: str, max_chars: int = OBSERVATION_CHARS) -> str:
    """Cut ``text`` to at most ``max_chars`` characters from the middle, keeping its head and tail, with a marker."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 32:
        raise ValueError(f"max_chars must be an int >= 32 (room for the marker), got {max_chars!r}")
    if len(text) <= max_chars:
        return text
    # The marker's length depends on how much it replaces; the cut grows until the whole fits.
    cut = len(text) - max_chars
    while True:
        marker = f"\n...[{cut} chars cut]...\n"
        keep = max_chars - len(marker)
        if len(text) - keep == cut:
            break
        cut = len(text) - keep
    head = (keep + 1) // 2
    return text[:head] + marker + text[len(text) - (keep - head) :]


def tool_schema(fn: Callable) -> dict:
    """The JSON schema of a user tool, from its signature and Google-style docstring (transformers builds it)."""
    if not callable(fn):
        raise TypeError(f"a tool must be a function, got {fn!r}")
    from transformers.utils import get_json_schema  # only here: the rest of fastrl.tools needs no transformers

    return get_json_schema(fn)


def call_tool(fn: Callable, arguments: dict[str, Any]) -> ToolResult:
    """Call a user tool with the model's arguments; what it returns, or the error it raised, is the observation.

    User tools are the user's own trusted code and run in this process; model-written code goes to ``run_python``.
    """
    try:
        inspect.signature(fn).bind(**arguments)
    except TypeError as error:
        return ToolResult(output=f"bad arguments for {getattr(fn, '__name__', fn)}: {error}", status="error")
    try:
        value = fn(**arguments)
    except Exception as error:  # the model's arguments may make any tool fail: that is its observation
        return ToolResult(output=f"{type(error).__name__}: {error}", status="error")
    return ToolResult(output=value if isinstance(value, str) else json.dumps(value, default=str), status="ok")
