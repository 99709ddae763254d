"""The tool options of `TrainConfig` (`tools`, `max_tool_calls`, `tool_format`, `tool_timeout_s`, `tool_memory_mb`):
the tools they name, and their checks at config time.

`tools` is a comma list ("" = off): `python` (the sandboxed interpreter, `fastrl.tools.run_python`) and / or
`module:function` (a user tool: a plain Python function, its JSON schema from its signature and docstring).
`tool_format` says how calls and observations are written: "code" (raw prompts: a ```` ```python ```` block is the
call, a ```` ```output ```` block its observation; only the `python` tool) or "hermes" (the tokenizer's chat
template with `tools=`, `<tool_call>{json}</tool_call>` calls, `tool` messages; needs `chat_template`).
"""

import importlib
from collections.abc import Callable

from .validate import ConfigError

__all__ = [
    "add_tool_functions",
    "PYTHON_SCHEMA",
    "TOOL_FORMATS",
    "check_tool_options",
    "check_tool_world",
    "parse_tools",
    "resolve_tools",
    "tool_schemas",
]

TOOL_FORMATS = ("code", "hermes")
# the built-in interpreter as a chat template's `tools=` lists it (its calls: {"name": "python", "arguments": {"code"}})
PYTHON_SCHEMA = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Runs Python code in a sandbox and returns what it printed (stdout, then stderr).",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python program to run."}},
            "required": ["code"],
        },
    },
}
_MIN_MEMORY_MB = 64  # the interpreter alone needs about this much address space


def parse_tools(spec: str) -> list[str]:
    """The tool names of a `tools` value ([] for ""): "python" or "module:function"; ValueError naming the bad part."""
    names = [p.strip() for p in spec.split(",")] if spec.strip() else []
    for name in names:
        module, colon, fn = name.partition(":")
        if name != "python" and not (colon and module and fn and ":" not in fn):
            raise ValueError(f"{name!r}: a tool is 'python' or 'module:function'")
    if len(set(names)) < len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"{twice!r} is named twice")
    return names


def resolve_tools(spec: str, given: list[Callable] | None = None) -> dict[str, Callable | None]:
    """Name -> function of every tool: the `tools` spec's (None for the built-in `python`), then the functions
    `given` from Python (`train(config, tools=[...])`), each under its `__name__`. ValueError naming the bad one."""
    tools: dict[str, Callable | None] = {}
    for name in parse_tools(spec):
        if name == "python":
            tools["python"] = None
            continue
        module, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"{name!r} does not import: {e}") from None
        if not callable(fn):
            raise ValueError(f"{name!r} is not a function")
        tools[attr] = fn
    for fn in given or []:
        if not callable(fn) or not getattr(fn, "__name__", None):
            raise ValueError(f"a tool must be a named function, got {fn!r}")
        if fn.__name__ in tools:
            raise ValueError(f"two tools are named {fn.__name__!r}")
        tools[fn.__name__] = fn
    return tools


def check_tool_options(c) -> None:
    """The tool fields alone and together with the rest (ConfigError naming the value); called by `TrainConfig`."""
    if c.max_tool_calls < 0:
        raise ConfigError("max_tool_calls", c.max_tool_calls, "must be >= 0 (0: the tools are never run)")
    if not 0 < c.tool_timeout_s < 3600:
        raise ConfigError("tool_timeout_s", c.tool_timeout_s, "must be in (0, 3600) (wall-clock seconds per call)")
    if c.tool_memory_mb < _MIN_MEMORY_MB:
        raise ConfigError("tool_memory_mb", c.tool_memory_mb, f"must be >= {_MIN_MEMORY_MB} (the interpreter's own)")
    if c.tool_format not in TOOL_FORMATS:
        raise ConfigError("tool_format", c.tool_format, f"must be one of {', '.join(TOOL_FORMATS)}")
    try:
        tools = resolve_tools(c.tools)
    except ValueError as e:
        raise ConfigError("tools", c.tools, str(e)) from None
    if not tools:
        return
    if c.tool_format == "code" and set(tools) != {"python"}:
        raise ConfigError("tools", c.tools, "tool_format='code' runs ```python blocks: only the python tool (user "
                          "tools need tool_format='hermes')")  # fmt: skip
    if c.tool_format == "hermes" and not c.chat_template:
        raise ConfigError("tool_format", "hermes", "writes calls and observations through the tokenizer's chat "
                          "template: set chat_template")  # fmt: skip
    refused = {
        "async_staleness": (c.async_staleness >= 0, "the rollout process samples single-turn"),
        "thinking_budget": (c.thinking_budget > 0, "its rounds and the tool turns are not composed"),
        "sequence_parallel": (c.sequence_parallel > 1, "untested with tool spans"),
        "fsdp": (c.fsdp, "untested with tool turns"),
    }
    for name, (on, why) in refused.items():
        if on:
            raise ConfigError(name, getattr(c, name), f"is refused with tools={c.tools!r}: {why}")


def check_tool_world(c, world: int) -> None:
    """Tools on a launch of `world` ranks: one replica only (untested across data-parallel ranks)."""
    if c.tools and world > c.sequence_parallel:
        raise ConfigError("tools", c.tools, f"is refused with data parallel (world {world}): untested across ranks")


def tool_schemas(config, given: list[Callable] | None = None) -> tuple[dict, ...]:
    """The JSON schemas the prompt's chat template lists (`tools=`) in the hermes format; () in the code format or
    without tools (a raw prompt says how to call the interpreter in its own words)."""
    if config.tool_format != "hermes":
        return ()
    from fastrl.tools import tool_schema

    return tuple(PYTHON_SCHEMA if fn is None else tool_schema(fn) for fn in resolve_tools(config.tools, given).values())


def add_tool_functions(spec: str, given: list[Callable]) -> str:
    """`spec` with the functions given from Python (`train(config, tools=[...])`) added as `module:function` entries,
    so every check and every engine sees them as it sees `--tools`. ValueError naming the function when it is not
    importable by that name (a lambda, a nested function, a method): define it at a module's top level."""
    names = parse_tools(spec)
    for fn in given:
        name, module = getattr(fn, "__qualname__", None), getattr(fn, "__module__", None)
        found = None
        if callable(fn) and name and module and "." not in name and "<" not in name:
            try:
                found = getattr(importlib.import_module(module), name, None)
            except ImportError:
                pass
        if found is not fn:
            raise ValueError(f"{fn!r}: a tool given to train() must be a module-level function (importable as "
                             "module:function)")  # fmt: skip
        names.append(f"{module}:{name}")
    return ",".join(names)
