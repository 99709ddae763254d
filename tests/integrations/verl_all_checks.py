"""The three verl check files in one run of verl's python (verl's import and the ranks' start paid once):

    PYTHONPATH=<repo>:<repo>/tests/integrations <verl python> tests/integrations/verl_all_checks.py OUT_DIR

`verl_checks.py` runs in this process; one `mp.spawn` of 2 gloo ranks then runs `verl_engine_checks.py`'s
variants and, in the same group, `verl_ulysses_checks.py`'s cases, on the same saved models; each file's own
`compare` judges its results. Each part's output follows a line `== <part>` (`== ranks`: what the ranks print); a
part that fails prints `== <part> FAILED` and its traceback, the others still run, and the exit code is non-zero.
"""

import os
import sys
import tempfile
import traceback

import torch.multiprocessing as mp
import verl_checks
import verl_engine_checks as engine
import verl_ulysses_checks as ulysses

PARTS = ("checks", "engine", "ulysses")


def worker(rank, world, init_file, paths, out_dir):
    engine.init_rank(rank, world, init_file)
    engine.run_cases(rank, paths, os.path.join(out_dir, "engine"))
    ulysses.run_cases(rank, paths[False], os.path.join(out_dir, "ulysses"))
    engine.leave()


def spawned(out_dir) -> str | None:
    """Run both 2-rank parts; the spawn's traceback when a rank failed."""
    for part in ("engine", "ulysses"):
        os.makedirs(os.path.join(out_dir, part), exist_ok=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            paths = engine.save_models(tmp)
            mp.spawn(worker, args=(2, os.path.join(tmp, "rdv"), paths, out_dir), nprocs=2, join=True)
    except Exception:
        return traceback.format_exc()
    return None


def part(name, run) -> bool:
    print(f"== {name}", flush=True)
    try:
        failures = run()
    except Exception:
        failures = [traceback.format_exc()]
    if failures:
        print(f"== {name} FAILED", *failures, sep="\n", flush=True)
    return not failures


def main(out_dir):
    passed = [part("checks", verl_checks.main)]
    print("== ranks", flush=True)
    spawn_error = spawned(out_dir)
    for name, module in (("engine", engine), ("ulysses", ulysses)):
        compare = (lambda: [spawn_error]) if spawn_error else (lambda m=module, n=name: m.compare(f"{out_dir}/{n}"))
        passed.append(part(name, compare))
    sys.exit(0 if all(passed) else 1)


if __name__ == "__main__":
    main(sys.argv[1])
