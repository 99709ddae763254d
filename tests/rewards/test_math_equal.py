"""math_equal: labelled answer pairs, the in-process fast path, hard time limits, threads, the batch API."""

import os
import subprocess
import sys
import threading
import time

import pytest
from math_pairs import PAIRS

from fastrl.rewards import VerifierPool, batch_math_equal, math_equal
from fastrl.rewards.normalize import quick_equal
from fastrl.rewards.verify import parse_leaf

pytestmark = pytest.mark.slow  # every test here starts processes (the verifier's worker pool)

# Pathological pairs sympy cannot settle quickly: exact evaluation of a 360-million-digit factorial (minutes in
# pure Python, still many seconds with gmpy2), of a 2^40-bit power. Both are mathematically equal, so only a
# working time limit makes them return (False).
SLOW_PAIRS = [("(5 \\cdot 10^7)!", "5 \\cdot 10^7 \\cdot (5 \\cdot 10^7-1)!"), ("2^{2^{40}}", "4^{2^{39}}")]
# Within a second of the timeout is the contract; the tests leave scheduling room on a loaded 2-core machine.
OVERSHOOT_S = 1.0


def _pair_id(pair):
    pred, gold, expected = pair
    return f"{pred} | {gold} | {expected}"


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(2) as p:
        p.start()
        yield p


def test_enough_labelled_pairs():
    assert len(PAIRS) >= 80
    assert sum(not e for _, _, e in PAIRS) >= 30  # the false-positive traps are half the point


@pytest.mark.parametrize("pred,gold,expected", PAIRS, ids=[_pair_id(p) for p in PAIRS])
def test_labelled_pair(pool, pred, gold, expected):
    assert pool.math_equal(pred, gold, timeout=5.0) is expected
    assert pool.math_equal(gold, pred, timeout=5.0) is expected  # symmetric


def test_fast_path_agrees_with_labels():
    decided = [(p, g, e, quick_equal(p, g)) for p, g, e in PAIRS]
    assert sum(q is not None for *_, q in decided) >= 15
    assert [(p, g) for p, g, e, q in decided if q is not None and q != e] == []


def test_batch_matches_labels_in_order(pool):
    results = pool.map([(p, g) for p, g, _ in PAIRS], timeout=5.0)
    assert results == [e for _, _, e in PAIRS]


def test_module_level_api_uses_default_pool():
    assert math_equal("\\frac{1}{2}", "0.5") is True
    assert math_equal("x^2-1", "(x-1)(x+1)") is True
    assert batch_math_equal([("2", "3"), ("\\sqrt{4}", "2"), (None, "2")]) == [False, True, False]


@pytest.mark.parametrize("pred,gold", [("(x+1)^{4000}", "x^{4000}+1"), *SLOW_PAIRS])
def test_pathological_pair_is_false_within_timeout(pool, pred, gold):
    timeout = 1.0
    start = time.monotonic()
    assert pool.math_equal(pred, gold, timeout=timeout) is False
    assert time.monotonic() - start < timeout + OVERSHOOT_S
    assert pool.math_equal("2x+2", "2(x+1)", timeout=5.0) is True  # the replaced worker serves again


@pytest.mark.parametrize("pred,gold", SLOW_PAIRS)
def test_timeout_kills_and_replaces_the_worker(pool, pred, gold):
    pool.start()
    before = {w.process.pid for w in pool._idle}
    assert pool.math_equal(pred, gold, timeout=0.5) is False
    pool.start()
    after = {w.process.pid for w in pool._idle}
    assert len(after) == 2 and len(before & after) == 1  # exactly one worker was killed and replaced


def test_timeout_from_non_main_thread(pool):
    out = {}

    def check():
        start = time.monotonic()
        out["result"] = pool.math_equal(*SLOW_PAIRS[0], timeout=1.0)
        out["elapsed"] = time.monotonic() - start
        out["right"] = math_equal("\\sqrt{8}", "2\\sqrt{2}", timeout=5.0)

    thread = threading.Thread(target=check)
    thread.start()
    thread.join(30)
    assert out == {"result": False, "elapsed": pytest.approx(1.0, abs=OVERSHOOT_S), "right": True}


def test_concurrent_threads_share_the_pool(pool):
    results = [None] * 4

    def check(k):
        results[k] = pool.map([("\\frac{2}{4}", "0.5"), (f"{k}x", f"x \\cdot {k}"), ("4", "4\\sqrt{2}")])

    threads = [threading.Thread(target=check, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [[True, True, False]] * 4


def test_batch_with_slow_pairs_keeps_fast_answers(pool):
    pairs = [SLOW_PAIRS[0], ("x^2-1", "(x-1)(x+1)"), SLOW_PAIRS[1], ("\\sin(\\pi/6)", "0.5"), ("2", "3")]
    start = time.monotonic()
    assert pool.map(pairs, timeout=1.0) == [False, True, False, True, False]
    # Two workers, two 1 s timeouts running side by side, plus restarts: far from the 5 s of doing it serially.
    assert time.monotonic() - start < 5.0


def test_batch_checks_each_distinct_pair_once(pool, monkeypatch):
    sent = []
    run = pool._run
    monkeypatch.setattr(pool, "_run", lambda tasks, timeout: sent.append(list(tasks)) or run(tasks, timeout))
    pairs = [("x+x", "2x")] * 5 + [("y", "2y")] * 3 + [("7", "7.0")] * 2
    assert pool.map(pairs) == [True] * 5 + [False] * 3 + [True] * 2
    assert sent == [[("x+x", "2x"), ("y", "2y")]]  # plain numbers never leave this process


def test_dead_worker_is_replaced(pool):
    pool.start()
    for worker in list(pool._idle):
        os.kill(worker.process.pid, 9)
        worker.process.wait()
    assert pool.map([("x+x", "2x"), ("\\sqrt{2}^2", "2"), ("1", "2")], timeout=5.0) == [True, True, False]
    assert pool._count == 2


def test_none_and_malformed_are_false(pool):
    assert pool.math_equal(None, "1") is False
    assert pool.math_equal("\\boxed{", "1") is False
    assert pool.math_equal("\\\\\\", "}") is False


def test_plain_text_is_never_evaluated_as_python(pool, tmp_path):
    # sympy's parse_expr calls eval(); untrusted completions must not reach it with names other than math.
    marker = tmp_path / "pwned"
    payload = f"sqrt(__import__('os').system('touch {marker}'))"
    assert parse_leaf(payload) is None  # the parser itself, below the prose filter of the comparison
    assert pool.math_equal(payload, "0") is False
    assert parse_leaf("sqrt(2).__class__") is None
    assert not marker.exists()
    assert parse_leaf("sqrt(2)*x") is not None
    assert pool.math_equal("sqrt(2)*sqrt(2)", "2") is True  # plain-text math still parses


def test_bad_arguments_raise(pool):
    with pytest.raises(ValueError, match="timeout"):
        pool.math_equal("1", "1", timeout=0)
    with pytest.raises(ValueError, match="nan"):
        pool.math_equal("1", "1", timeout=float("nan"))
    with pytest.raises(TypeError, match="gold"):
        pool.math_equal("1", None)
    with pytest.raises(TypeError, match="pred"):
        pool.math_equal(["1"], "1")
    with pytest.raises(TypeError, match="pair"):
        pool.map(["1"])
    with pytest.raises(ValueError, match="num_workers"):
        VerifierPool(0)


_ORPHAN_PARENT = f"""
from fastrl.rewards import VerifierPool
pool = VerifierPool(2)
pool.start()
print(*[w.process.pid for w in pool._idle], flush=True)
pool.map({SLOW_PAIRS!r}, timeout=1.0)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_workers_die_with_a_killed_parent():
    # A parent killed by SIGKILL runs no cleanup; its workers, busy in a long C call, must still end by themselves.
    parent = subprocess.Popen([sys.executable, "-c", _ORPHAN_PARENT], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2
    time.sleep(0.3)  # let them take the slow pairs
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids)


def test_close_kills_workers():
    p = VerifierPool(2)
    assert p.map([("x", "x+0"), ("2y", "y+y")]) == [True, True]
    processes = [w.process for w in p._idle]
    assert len(processes) == 2
    p.close()
    assert all(proc.poll() is not None for proc in processes)
    with pytest.raises(RuntimeError, match="closed"):
        p.math_equal("x", "y")
