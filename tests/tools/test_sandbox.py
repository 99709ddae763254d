"""The python tool's API: argument checks, the refusal where namespaces fail, the opt-out, the Sandbox interface
and the SandboxFusion client (against an HTTP server in this process)."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from fastrl.tools import LocalSandbox, SandboxFusion, SandboxUnavailableError, ToolResult, run_python
from fastrl.tools import sandbox as sandbox_module


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"code": b"print(1)"}, "code must be a str"),
        ({"code": "x" * 100_001}, "code must be under"),
        ({"code": "print(1)", "timeout_s": 0}, "timeout_s must be"),
        ({"code": "print(1)", "timeout_s": True}, "timeout_s must be"),
        ({"code": "print(1)", "memory_mb": 1.5}, "memory_mb must be"),
        ({"code": "print(1)", "memory_mb": 8}, "memory_mb must be"),
    ],
    ids=["bytes-code", "long-code", "zero-timeout", "bool-timeout", "float-memory", "tiny-memory"],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        LocalSandbox().run(**kwargs)


def test_bad_sandbox_settings_are_named():
    with pytest.raises(ValueError, match="max_concurrency must be a positive int, got 0"):
        LocalSandbox(0)
    with pytest.raises(TypeError, match="unsafe_without_namespaces must be a bool, got 'yes'"):
        LocalSandbox(unsafe_without_namespaces="yes")
    with pytest.raises(TypeError, match="sandbox must have a run"):
        run_python("print(1)", sandbox=object())
    with pytest.raises(ValueError, match="applies to the default sandbox"):
        run_python("print(1)", sandbox=LocalSandbox(), unsafe_without_namespaces=True)
    with pytest.raises(ValueError, match="url must be an http"):
        SandboxFusion("sandbox:8080")


def test_run_python_hands_the_call_to_the_given_sandbox():
    calls = []

    class Recorder:
        def run(self, code, *, timeout_s=10.0, memory_mb=1024):
            calls.append((code, timeout_s, memory_mb))
            return ToolResult(output="42\n", status="ok")

    assert run_python("print(42)", timeout_s=3.0, memory_mb=256, sandbox=Recorder()) == ToolResult("42\n", "ok")
    assert calls == [("print(42)", 3.0, 256)]


@pytest.fixture
def refusing_bwrap(tmp_path, monkeypatch):
    """Namespace creation fails as it does under Docker's default seccomp profile."""
    script = tmp_path / "bwrap"
    script.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    script.chmod(0o755)
    monkeypatch.setattr(sandbox_module, "_bwrap", lambda: str(script))
    monkeypatch.setattr(sandbox_module, "_probed", {})


@pytest.mark.slow
def test_refuses_where_namespaces_fail(refusing_bwrap):
    with pytest.raises(SandboxUnavailableError, match="No permissions to create new namespace.*unsafe_without_"):
        LocalSandbox().run("print(1)")


@pytest.mark.slow
def test_the_opt_out_runs_without_namespaces(refusing_bwrap):
    result = run_python("import os\nprint(sorted(os.environ))", unsafe_without_namespaces=True)
    assert result.status == "ok" and result.output == "[]\n", result


@pytest.mark.slow
def test_run_python_reports_exit_status_and_both_streams():
    assert run_python("print('a')") == ToolResult("a\n", "ok")
    result = run_python("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)")
    assert result == ToolResult("out\nerr\n", "error")
    crash = run_python("def f():\n    return 1 / 0\nf()")
    assert crash.status == "error" and crash.output.startswith(
        'Traceback (most recent call last):\n  File "<string>", line 3, in <module>\n'
    ), crash  # the traceback starts at the model's code, not at the launcher's
    pool = "import multiprocessing as mp\nif __name__ == '__main__':\n    print(mp.Pool(2).map(abs, [-1, -2]))"
    assert run_python(pool) == ToolResult("[1, 2]\n", "ok")  # __main__, /dev/shm and fork work


class _FakeFusion(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's spelling)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, body))
        run = {"status": "Finished", "return_code": 0, "stdout": "x" * 20_000, "stderr": ""}
        if "loop" in body["code"]:
            run = {"status": "TimeLimitExceeded", "return_code": None, "stdout": "", "stderr": ""}
        elif "raise" in body["code"]:
            run = {"status": "Finished", "return_code": 1, "stdout": "", "stderr": "ValueError"}
        reply = {"status": "SandboxError", "run_result": None} if "broken" in body["code"] else {"run_result": run}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_sandbox_fusion_maps_the_request_and_the_reply():
    server = HTTPServer(("127.0.0.1", 0), _FakeFusion)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        fusion = SandboxFusion(f"http://127.0.0.1:{server.server_port}/")
        long = run_python("print('x' * 20000)", timeout_s=2.5, memory_mb=300, sandbox=fusion)
        assert long.status == "ok" and long.output.startswith("x" * 16_384) and "3616 more bytes" in long.output
        assert server.requests[0] == (
            "/run_code",
            {"code": "print('x' * 20000)", "language": "python", "run_timeout": 2.5, "memory_limit_MB": 300},
        )
        assert fusion.run("while True: pass  # loop").status == "timeout"
        assert fusion.run("raise ValueError") == ToolResult("ValueError", "error")
        with pytest.raises(RuntimeError, match="did not run the code"):
            fusion.run("broken")
    finally:
        server.shutdown()
        server.server_close()
    assert os.getpid()  # this process served and survived every reply


@pytest.mark.slow
def test_a_python_directory_under_tmp_stays_visible_and_read_only(tmp_path, monkeypatch):
    # A virtualenv made under /tmp (a test's, a CI clone's) holds the interpreter and its packages: the sandbox's
    # private /tmp must not hide it, and the model must not write to it.
    assert str(tmp_path).startswith("/tmp/")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "kept_module.py").write_text("VALUE = 41 + 1\n")
    python_dirs = sandbox_module._python_dirs
    monkeypatch.setattr(sandbox_module, "_python_dirs", lambda: [*python_dirs(), str(tmp_path / "site")])
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path / 'site')!r}); import kept_module; print(kept_module.VALUE)\n"
        f"open({str(tmp_path / 'site' / 'new.py')!r}, 'w')\n"
    )
    result = run_python(code, timeout_s=20.0)
    assert result.status == "error" and result.output.startswith("42\n"), result
    assert "Read-only file system" in result.output, result
    assert not (tmp_path / "site" / "new.py").exists()
