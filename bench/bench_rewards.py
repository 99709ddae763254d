"""Math verifier throughput and time-limit overshoot, through the batch API (``VerifierPool.map``).

Run: ``python -m bench.bench_rewards [--workers 2] [--out results.json]``

Workloads (random values, so no cache helps; every result is checked against its label before its speed is
reported):
  numeric        plain numbers in mixed spellings ("1,000" / "1000", "\\frac{3}{4}" / "0.75", "50\\%" / "0.5"),
                 decided in the calling process by the exact-rational fast path;
  numeric-sympy  numeric expressions that need sympy ("2^{3}" / "8", "\\sqrt{16}" / "4"), in the workers;
  symbolic       expressions in x ("(x+a)(x-a)" / "x^2-a^2"), random-point evaluation in the workers.
Then: the worst overshoot past the timeout on pathological pairs (warm pool), the worst time past the limit of a
reward call on 1 MB hostile completions (extraction included), and worker start-up time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time

from fastrl.rewards import VerifierPool


def numeric_pairs(n: int, rng: random.Random) -> list[tuple[str, str, bool]]:
    pairs = []
    for _ in range(n):
        a, b = rng.randint(1, 999), rng.randint(2, 999)
        kind = rng.randrange(5)
        if kind == 0:
            pred, gold = f"{a},{rng.randint(0, 999):03d}", None
            gold = pred.replace(",", "")
        elif kind == 1:
            pred, gold = f"\\frac{{{a}}}{{{b}}}", f"{a}/{b}"
        elif kind == 2:
            pred, gold = f"{a}\\%", f"{a / 100}"
        elif kind == 3:
            pred, gold = f"{a}.5", f"{a}.50"
        else:
            pred, gold = f"\\${a}", f"{a} \\text{{ dollars}}"
        if rng.random() < 0.5:
            pairs.append((pred, gold, True))
        else:
            pairs.append((pred, f"{a + 1}", False))
    return pairs


def numeric_sympy_pairs(n: int, rng: random.Random) -> list[tuple[str, str, bool]]:
    pairs = []
    for _ in range(n):
        a, b = rng.randint(2, 999), rng.randint(2, 6)
        kind = rng.randrange(3)
        if kind == 0:
            pred, value = f"{a}^{{{b}}}", a**b
        elif kind == 1:
            pred, value = f"\\sqrt{{{a * a}}}", a
        else:
            pred, value = f"{a} \\cdot {b} + 1", a * b + 1
        ok = rng.random() < 0.5
        pairs.append((pred, str(value if ok else value + 1), ok))
    return pairs


def symbolic_pairs(n: int, rng: random.Random) -> list[tuple[str, str, bool]]:
    pairs = []
    for _ in range(n):
        a, b = rng.randint(2, 300), rng.randint(1, 300)
        kind = rng.randrange(3)
        if kind == 0:
            pred, gold, wrong = f"(x+{a})(x-{a})", f"x^2-{a * a}", f"x^2+{a * a}"
        elif kind == 1:
            pred, gold, wrong = f"\\frac{{x^2-{a * a}}}{{x-{a}}}", f"x+{a}", f"x-{a}"
        else:
            pred, gold, wrong = f"{a}(x+{b})", f"{a}x+{a * b}", f"{a}x+{b}"
        ok = rng.random() < 0.5
        pairs.append((pred, gold if ok else wrong, ok))
    return pairs


def unique(make, n: int, rng: random.Random) -> list[tuple[str, str, bool]]:
    """n distinct pairs: the pool checks a repeated (pred, gold) once per batch, which would inflate the rate."""
    pairs: dict[tuple[str, str], bool] = {}
    while len(pairs) < n:
        for pred, gold, expected in make(n, rng):
            pairs.setdefault((pred, gold), expected)
    return [(p, g, e) for (p, g), e in list(pairs.items())[:n]]


def throughput(pool: VerifierPool, make, n: int, rng: random.Random, repeats: int) -> dict:
    rates = []
    for _ in range(repeats):
        pairs = unique(make, n, rng)  # fresh pairs each time: the workers cache parsed answers
        start = time.perf_counter()
        results = pool.map([(p, g) for p, g, _ in pairs], timeout=5.0)
        elapsed = time.perf_counter() - start
        wrong = [(p, g, e) for (p, g, e), r in zip(pairs, results) if r != e]
        if wrong:
            raise AssertionError(f"{len(wrong)} wrong verdicts, e.g. {wrong[:3]}: no speed reported")
        rates.append(len(pairs) / elapsed)
    rates.sort()
    return {
        "pairs": n,
        "checks_per_s_median": statistics.median(rates),
        "checks_per_s_p20": rates[int(0.2 * (len(rates) - 1))],
        "checks_per_s_p80": rates[int(0.8 * (len(rates) - 1))],
    }


def overshoot(pool: VerifierPool, timeout: float, repeats: int) -> dict:
    slow = [
        ("(5 \\cdot 10^7)!", "5 \\cdot 10^7 \\cdot (5 \\cdot 10^7-1)!"),
        ("2^{2^{40}}", "4^{2^{39}}"),
        ("(x+1)^{4000}", "x^{4000}+1"),
    ]
    worst, worst_pair = -timeout, None
    for _ in range(repeats):
        for pair in slow:
            pool.start()  # warm: the overshoot of the check itself, not the replacement's start-up
            start = time.perf_counter()
            result = pool.math_equal(*pair, timeout=timeout)
            over = time.perf_counter() - start - timeout
            if result is not False:
                raise AssertionError(f"{pair} returned {result}, expected False")
            if over > worst:
                worst, worst_pair = over, pair
    return {"timeout_s": timeout, "max_overshoot_s": worst, "worst_pair": worst_pair}


def hostile_completions() -> dict[str, str]:
    """1 MB completions built to stall a scanner: repeated markers, unclosed braces, deep nesting, long digit runs."""
    mb = 1 << 20
    return {
        "answer-parens": "Answer: " + "\\(" * (mb // 2),
        "repeated-markers": "The answer is " * (mb // 14),
        "unclosed-braces": "\\boxed{" + "{" * mb,
        "nested-frac": "\\boxed{" + "\\frac{1}{" * (mb // 10) + "2" + "}" * (mb // 10) + "}",
        "digit-run": "The answer is " + "7" * mb,
        "deep-boxes": "\\boxed{" * (mb // 7) + "1" + "}" * (mb // 7),
        "nested-parens": "\\boxed{" + "(" * mb + ")" * mb + "}",
        "many-boxes": "\\boxed{1} no " * (mb // 13),
    }


def hostile(pool: VerifierPool, timeout: float) -> dict:
    worst, worst_name = -timeout, None
    for name, text in hostile_completions().items():
        for extract in ("strict", "lenient"):
            pool.start()  # warm: a replacement's start-up is not part of the call
            start = time.perf_counter()
            result = pool.map([(text, "2")], timeout=timeout, extract=extract)
            over = time.perf_counter() - start - timeout
            if result != [False]:
                raise AssertionError(f"{name} returned {result}, expected [False]")
            if over > worst:
                worst, worst_name = over, f"{name} ({extract})"
    return {"timeout_s": timeout, "max_past_limit_s": worst, "worst_input": worst_name}


def startup(workers: int) -> dict:
    start = time.perf_counter()
    with VerifierPool(workers) as pool:
        pool.start()
        pool_start = time.perf_counter() - start
    # What a multiprocessing spawn/forkserver child of a trainer would pay: importing the losses (and so torch).
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import fastrl.losses, fastrl.rewards.verify"], check=True)
    package_import = time.perf_counter() - start
    return {"pool_start_s": pool_start, "spawn_with_package_import_s": package_import}


def environment(workers: int) -> dict:
    from importlib.metadata import version

    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {
        "git_sha": sha or None,
        "python": platform.python_version(),
        "sympy": version("sympy"),
        "latex2sympy2_extended": version("latex2sympy2_extended"),
        "cpus": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],  # the machine may be shared: read the rates with this
        "workers": workers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    rng = random.Random(0)
    results = environment(args.workers)
    results["startup"] = startup(args.workers)
    with VerifierPool(args.workers) as pool:
        pool.start()
        results["numeric"] = throughput(pool, numeric_pairs, 2000, rng, args.repeats)
        results["numeric-sympy"] = throughput(pool, numeric_sympy_pairs, 300, rng, args.repeats)
        results["symbolic"] = throughput(pool, symbolic_pairs, 150, rng, args.repeats)
        results["overshoot"] = overshoot(pool, timeout=1.0, repeats=2)
        results["hostile"] = hostile(pool, timeout=1.0)
    print(f"{args.workers} workers, {results['cpus']} CPUs, load average {results['load_average_1min']:.1f} at start")
    for name in ("numeric", "numeric-sympy", "symbolic"):
        r = results[name]
        print(
            f"{name:14s} {r['pairs']:5d} pairs  {r['checks_per_s_median']:9.1f} checks/s "
            f"(p20 {r['checks_per_s_p20']:.1f}, p80 {r['checks_per_s_p80']:.1f})"
        )
    o = results["overshoot"]
    print(f"max overshoot past a {o['timeout_s']} s timeout: {o['max_overshoot_s'] * 1e3:.0f} ms ({o['worst_pair']})")
    h = results["hostile"]
    past = h["max_past_limit_s"] * 1e3
    print(f"1 MB hostile completions: worst {past:+.0f} ms past a {h['timeout_s']} s limit ({h['worst_input']})")
    s = results["startup"]
    print(
        f"start-up: pool of {args.workers} ready in {s['pool_start_s']:.2f} s; a child importing torch "
        f"(spawn/forkserver) would need {s['spawn_with_package_import_s']:.2f} s each"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
