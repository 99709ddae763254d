"""A sandbox service instead of the local sandbox: SandboxFusion's ``run_code`` HTTP API."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

from .sandbox import _KEEP_BYTES, ToolResult, _text

__all__ = ["SandboxFusion"]

# Seconds the service may take beyond the code's own limit (queueing, container start) before the call fails.
_SERVICE_MARGIN_S = 30.0


class SandboxFusion:
    """Runs the python tool's code on a SandboxFusion server (``POST {url}/run_code``).

    The service applies its own isolation; this client only maps the call and the reply. A reply that is not a
    run (the service's "SandboxError", an HTTP error, no answer within timeout + 30 s) raises RuntimeError: that is
    a broken service, not an observation for the model.

    Args:
        url: the server's base address, e.g. "http://sandbox:8080".
        max_concurrency: requests in flight at once from this process.
    """

    def __init__(self, url: str, *, max_concurrency: int = 32) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http(s) address, got {url!r}")
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(f"max_concurrency must be a positive int, got {max_concurrency!r}")
        self.url = url.rstrip("/")
        self.max_concurrency = max_concurrency
        self._slots = threading.BoundedSemaphore(max_concurrency)

    def run(self, code: str, *, timeout_s: float = 10.0, memory_mb: int = 1024) -> ToolResult:
        """Run ``code`` on the service; see ``fastrl.tools.run_python``."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < 3600:
            raise ValueError(f"timeout_s must be a number of seconds in (0, 3600), got {timeout_s!r}")
        if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < 1:
            raise ValueError(f"memory_mb must be a positive int, got {memory_mb!r}")
        body = {"code": code, "language": "python", "run_timeout": timeout_s, "memory_limit_MB": memory_mb}
        request = urllib.request.Request(
            f"{self.url}/run_code",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with self._slots:
            try:
                with urllib.request.urlopen(request, timeout=timeout_s + _SERVICE_MARGIN_S) as response:
                    reply = json.loads(response.read())
            except (urllib.error.URLError, TimeoutError, ValueError) as error:
                raise RuntimeError(f"SandboxFusion at {self.url} failed: {error}") from error
        run = reply.get("run_result") if isinstance(reply, dict) else None
        if reply.get("status") == "SandboxError" or not isinstance(run, dict):
            raise RuntimeError(f"SandboxFusion at {self.url} did not run the code: {reply!r:.300}")
        output = "".join(_clip(run.get(name) or "") for name in ("stdout", "stderr"))
        if run.get("status") == "TimeLimitExceeded":
            return ToolResult(output=output + f"\n[timed out after {timeout_s:g} s]", status="timeout")
        ok = run.get("status") == "Finished" and run.get("return_code") == 0
        return ToolResult(output=output, status="ok" if ok else "error")


def _clip(text: str) -> str:
    data = text.encode("utf-8", errors="replace")
    return _text(bytearray(data[:_KEEP_BYTES]), max(0, len(data) - _KEEP_BYTES))
