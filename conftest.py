"""The `slow` marker, enforced by what a test does rather than by how long it took.

`pytest -m "not slow"` is the edit loop, so a test that starts another process (a subprocess, torchrun, a second
rank, a `multiprocessing` child, a venv build) must carry `@pytest.mark.slow`. While a test that does not carry it
runs (its fixtures' setup included), every such start is recorded; a recorded start fails the test with the
command it ran. The check covers every collected test path (tests/ and bench/).

The edit loop also leaves out the Triton interpreter's repeats: of a test function's cases whose `impl` is
"triton", the first runs in the edit loop and the others carry `slow` (each interprets the kernels in Python, a
few seconds a case). A module that sets `EDIT_LOOP_CASES = n` keeps only the first n cases of each of its
parametrized tests in the edit loop (for matrices of whole trainer steps). CI runs every test, marked or not.
"""

import contextlib
import multiprocessing.process
import platform
import subprocess
import threading
import venv

import pytest

# The standard library's platform probe runs `uname -p` once per interpreter, whichever caller asks first (TRL and
# DeepSpeed ask at import); asking here keeps that one start out of whichever test happens to import them first.
platform.processor()

_SLOW_REASON = "starts another process but is not marked slow: add @pytest.mark.slow"


@contextlib.contextmanager
def recording_process_starts(started: list):
    """Append a description of each process start (Popen, multiprocessing, venv) to `started` while inside.

    Only starts from the main thread count: a pool's background thread that replaces a worker may run during any
    later test, which did not start it."""
    popen_init = subprocess.Popen.__init__
    process_start = multiprocessing.process.BaseProcess.start
    venv_create = venv.EnvBuilder.create

    def popen(self, args, *a, **kw):
        if threading.current_thread() is threading.main_thread():
            started.append(f"subprocess {args if isinstance(args, str) else ' '.join(map(str, args))}"[:300])
        return popen_init(self, args, *a, **kw)

    def start(self):
        if threading.current_thread() is threading.main_thread():
            started.append(f"multiprocessing child {self.name}")
        return process_start(self)

    def create(self, env_dir):
        if threading.current_thread() is threading.main_thread():
            started.append(f"venv {env_dir}")
        return venv_create(self, env_dir)

    subprocess.Popen.__init__ = popen
    multiprocessing.process.BaseProcess.start = start
    venv.EnvBuilder.create = create
    try:
        yield started
    finally:
        subprocess.Popen.__init__ = popen_init
        multiprocessing.process.BaseProcess.start = process_start
        venv.EnvBuilder.create = venv_create


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if item.get_closest_marker("slow") is not None:
        return (yield)
    item.stash[_STARTS] = []
    with recording_process_starts(item.stash[_STARTS]):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    starts = item.stash.get(_STARTS, None)
    if starts and report.when == "call" and report.passed:
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid} {_SLOW_REASON}; it started: {starts[0]}"
    return report


_STARTS = pytest.StashKey[list]()


def pytest_collection_modifyitems(items):
    triton, cases = set(), {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or item.get_closest_marker("slow") is not None:
            continue
        key = (item.path, item.originalname)
        keep = getattr(item.module, "EDIT_LOOP_CASES", None)
        cases[key] = cases.get(key, 0) + 1
        if (keep is not None and cases[key] > keep) or (callspec.params.get("impl") == "triton" and key in triton):
            item.add_marker(pytest.mark.slow)
        if callspec.params.get("impl") == "triton":
            triton.add(key)
