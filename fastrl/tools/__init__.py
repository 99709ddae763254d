"""Tools a model calls inside its chain of thought; torch-free and independent of the rest of fastrl.

``run_python`` runs model-written code in a fresh, confined interpreter (``sandbox.LocalSandbox``: bubblewrap
namespaces, rlimits, an unprivileged uid) or in any other ``Sandbox`` (``remote.SandboxFusion``: an HTTP service).
Model code is never executed or imported in the calling process. ``calls`` parses tool calls as models write them
(code blocks; Hermes / Qwen ``<tool_call>`` through transformers' response parser), truncates observations and
calls user tools. docs/tools.md has it all.
"""

from __future__ import annotations

from .api import Sandbox, run_python
from .calls import (
    HERMES_RESPONSE_TEMPLATE,
    HERMES_START,
    OBSERVATION_CHARS,
    ToolCall,
    call_tool,
    hermes_call,
    last_python_block,
    output_block,
    tool_schema,
    truncate_observation,
)
from .remote import SandboxFusion
from .sandbox import LocalSandbox, SandboxUnavailableError, ToolResult

__all__ = [
    "HERMES_RESPONSE_TEMPLATE",
    "HERMES_START",
    "OBSERVATION_CHARS",
    "LocalSandbox",
    "Sandbox",
    "SandboxFusion",
    "SandboxUnavailableError",
    "ToolCall",
    "ToolResult",
    "call_tool",
    "hermes_call",
    "last_python_block",
    "output_block",
    "run_python",
    "tool_schema",
    "truncate_observation",
]
