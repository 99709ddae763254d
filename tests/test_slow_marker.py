"""The `slow` marker is enforced by what a test does: the root conftest fails an unmarked test that starts a process."""

import pathlib

import pytest

pytest_plugins = ["pytester"]

ROOT_CONFTEST = pathlib.Path(__file__).resolve().parents[1] / "conftest.py"

CASES = """
import multiprocessing
import subprocess
import sys

import pytest


def test_unmarked_subprocess():
    subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60)


def test_unmarked_child():
    p = multiprocessing.get_context("spawn").Process(target=int)
    p.start()
    p.join(60)


@pytest.fixture
def worker():
    return subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60)


def test_unmarked_through_a_fixture(worker):
    pass


@pytest.mark.slow
def test_marked_subprocess():
    subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60)


def test_no_process():
    assert sum(range(4)) == 6
"""


@pytest.mark.slow
def test_an_unmarked_test_that_starts_a_process_fails(pytester):
    pytester.makeconftest(ROOT_CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    slow: a multi-process test\n")
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(passed=2, failed=3)
    result.stdout.fnmatch_lines(["*test_unmarked_subprocess starts another process but is not marked slow*"])
    result.stdout.fnmatch_lines(["*test_unmarked_child starts another process*multiprocessing child*"])
    result.stdout.fnmatch_lines(["*test_unmarked_through_a_fixture starts another process*"])
