"""Tool calls as models write them, their observations, and user tools as plain functions.

Two formats, as the ecosystem writes them:

- raw prompts (ToRL, SimpleTIR): a fenced ```` ```python ```` block is the call; the sampler stops at its closing
  fence, the tool runs, and the observation follows as a ```` ```output ```` block (``output_block``);
- chat models (Hermes, Qwen): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in ChatML assistant turns,
  read by transformers' response parser (``parse_response``'s machinery) with ``HERMES_RESPONSE_TEMPLATE`` and the
  text before the call as ``prefix``; the observation goes back as a ``tool`` message through the chat template.

A malformed call is not an exception: it comes back as a ``ToolCall`` with ``error`` set, which the rollout turns
into an observation (the model sees what it got wrong), never a crash.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .sandbox import ToolResult

__all__ = [
    "HERMES_RESPONSE_TEMPLATE",
    "HERMES_START",
    "OBSERVATION_CHARS",
    "ToolCall",
    "call_tool",
    "hermes_call",
    "last_python_block",
    "output_block",
    "tool_schema",
    "truncate_observation",
]

# verl's default cap on a tool's observation (characters).
OBSERVATION_CHARS = 256
_PYTHON_BLOCK = re.compile(r"```python[ \t]*\n(.*?)```", re.DOTALL)
_OUTPUT_OPEN = re.compile(r"\s*```output\b")
# where a ChatML assistant turn starts: the parser reads the prefix from its last occurrence on
HERMES_START = "<|im_start|>assistant\n"
# transformers' response template (`PreTrainedTokenizerBase.parse_response`) of a Hermes / Qwen assistant turn: an
# optional <think> block, any number of <tool_call>{json}</tool_call>, the rest is content up to <|im_end|>. The
# call's close is a literal, so a streaming parser commits it on the token that completes it.
HERMES_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": HERMES_START,
    "fields": {
        "reasoning_content": {"open": "<think>", "close_pattern": r"</think>\s*", "content": "text"},
        "tool_calls": {
            "open": "<tool_call>",
            "close": "</tool_call>",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


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


def hermes_call(text: str, *, prefix: str, tools: Sequence[dict] = ()) -> ToolCall | None:
    """The first ``<tool_call>{json}</tool_call>`` that ``text`` closes, as transformers' ``parse_response`` reads it.

    Args:
        text: the model's output since its last observation (decoded).
        prefix: the text the model continued (the prompt, and the completion before ``text``); the parser starts
            from its last ``HERMES_START``, so a call inside a ``<think>`` block the template opened is thinking.
        tools: the tools' JSON schemas, which type the arguments (``"7"`` -> 7 for an integer parameter).

    Returns:
        None when ``text`` closes no call (none, or one still open); else the call, or a ``ToolCall`` with
        ``error`` set when its body is not ``{"name": str, "arguments": object}`` (the model's observation).
    """
    if not isinstance(text, str) or not isinstance(prefix, str):
        raise TypeError(f"text and prefix must be str, got {type(text).__name__} and {type(prefix).__name__}")
    import transformers  # only here: the rest of fastrl.tools needs no transformers
    from packaging.version import Version

    if Version(transformers.__version__) < Version("5.15"):
        raise ImportError(f"Hermes tool calls are read by transformers' response parser with typed arguments "
                          f"(transformers >= 5.15); transformers {transformers.__version__} is installed")  # fmt: skip
    from transformers.utils.chat_parsing import ResponseParser

    # parse_response feeds the whole text and finalizes, which also parses a call still open (and fails on it);
    # fed without finalizing, the parser reports each call as its close commits
    parser = ResponseParser(HERMES_RESPONSE_TEMPLATE, prefix=prefix, tools=list(tools))
    try:
        events = parser.feed(text)
    except ValueError as error:  # only a closed call's body is parsed as it closes (the other fields are text)
        return ToolCall(None, {}, "the tool call is not valid JSON: " + "; ".join(str(error).splitlines()[1:]))
    closed = [e["value"] for e in events if e["type"] == "region_close" and e["field"] == "tool_calls"]
    return _call_of(closed[0]) if closed else None


def _call_of(parsed) -> ToolCall:
    """A ``ToolCall`` from one of ``parse_response``'s ``tool_calls`` (``{"type": "function", "function": ...}``)."""
    call = parsed.get("function") if isinstance(parsed, dict) else None
    name = call.get("name") if isinstance(call, dict) else None
    arguments = call.get("arguments", {}) if isinstance(call, dict) else None
    if isinstance(arguments, str):  # some templates carry the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = None
    if not isinstance(name, str) or not isinstance(arguments, dict):
        error = 'a tool call must be {"name": str, "arguments": object}'
        return ToolCall(None, {}, f"{error}, got {json.dumps(call)[:80]}")
    return ToolCall(name, arguments)


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
