"""A planted slow-down of fastrl's own kernels (`python -m bench --plant-slowdown F`), to show that the
verdict catches a slower fastrl.

Every call of fastrl's chunked token walks (`fused_loss.api.fused_forward`,
`logprobs.chunked.chunked_forward` and `chunked_backward`) waits F × its own wall time after it returns.
Each function is replaced where it is defined AND in every loaded fastrl module that imported it by name
(those look it up in their own namespace at call time), and put back everywhere afterwards. A nested call
(the backward recursing on the live rows) adds no delay of its own: the outermost call's wall time already
holds it. The run's environment records the fraction and the calls counted; the report says the numbers
are planted.
"""

import functools
import importlib
import sys
import threading
import time
from contextlib import contextmanager

import torch

TARGETS = (
    ("fastrl.kernels.fused_loss.api", "fused_forward"),
    ("fastrl.kernels.logprobs.chunked", "chunked_forward"),
    ("fastrl.kernels.logprobs.chunked", "chunked_backward"),
)


def _slowed(fn, fraction: float, record: dict, depth: threading.local):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        outer = getattr(depth, "n", 0) == 0
        depth.n = getattr(depth, "n", 0) + 1
        cuda = outer and torch.cuda.is_available() and torch.cuda.is_initialized()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            depth.n -= 1
            if cuda:
                torch.cuda.synchronize()
            if outer:
                delay = fraction * (time.perf_counter() - t0)
                time.sleep(delay)
                record["calls"][fn.__name__] += 1
                record["delay_s"] += delay

    return wrapper


@contextmanager
def planted_slowdown(fraction: float):
    """Within the block, fastrl's chunked walks run `fraction` slower; yields the record
    {"fraction", "calls": {name: outermost calls}, "delay_s"} (filled as calls happen)."""
    if not 0 < fraction <= 10:
        raise ValueError(f"--plant-slowdown must be a fraction in (0, 10], got {fraction}")
    record = {"fraction": fraction, "calls": {name: 0 for _, name in TARGETS}, "delay_s": 0.0}
    depth = threading.local()
    importlib.import_module("fastrl")
    swaps = {}  # original -> wrapper, and back on the way out
    for module_name, name in TARGETS:
        original = getattr(importlib.import_module(module_name), name)
        swaps[original] = _slowed(original, fraction, record, depth)
    _swap(swaps)
    try:
        yield record
    finally:  # a module imported inside the block took the wrapper from its defining module: restored too
        _swap({wrapper: original for original, wrapper in swaps.items()})


def _swap(swaps: dict) -> None:
    """Every attribute of a loaded fastrl module that is a key of `swaps` becomes its value."""
    by_id = {id(k): v for k, v in swaps.items()}  # keys stay alive in `swaps`: their ids stay unique
    for key, mod in list(sys.modules.items()):
        if mod is None or not (key == "fastrl" or key.startswith("fastrl.")):
            continue
        for attr, value in list(vars(mod).items()):
            if id(value) in by_id:
                setattr(mod, attr, by_id[id(value)])


def planted_lines(record: dict) -> list[str]:
    """The report's warning that the run's fastrl numbers are slowed on purpose."""
    calls = ", ".join(f"{k} {v}" for k, v in record["calls"].items())
    return [
        f"- **PLANTED SLOW-DOWN — NOT A REAL RUN**: every call of fastrl's chunked walks waited "
        f"{record['fraction']:g} × its own wall time (`--plant-slowdown {record['fraction']:g}`, bench/plant.py); "
        f"calls slowed: {calls}; {record['delay_s']:.2f} s added in all. Memory is measured unplanted."
    ]
