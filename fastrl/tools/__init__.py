"""Tools a model calls inside its chain of thought; torch-free and independent of the rest of fastrl.

``run_python`` runs model-written code in a fresh, confined interpreter (``sandbox.LocalSandbox``: bubblewrap
namespaces, rlimits, an unprivileged uid) or in any other ``Sandbox`` (``remote.SandboxFusion``: an HTTP service).
Model code is never executed or imported in the calling process. docs/tools.md describes the limits.
"""

from __future__ import annotations

from .api import Sandbox, run_python
from .remote import SandboxFusion
from .sandbox import LocalSandbox, SandboxUnavailableError, ToolResult

__all__ = ["LocalSandbox", "Sandbox", "SandboxFusion", "SandboxUnavailableError", "ToolResult", "run_python"]
