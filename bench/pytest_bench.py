"""The body shared by bench/test_bench_*.py: check against eager, then hand the closure to pytest-benchmark."""

import pytest
import torch

from bench.harness import DTYPES, REL_TOL, ShapeCache, relative_error


def case_id(provider: str, mode: str, shape: dict, dtype: str) -> str:
    return "-".join([provider, mode] + [f"{k}{v}" for k, v in shape.items()] + [dtype])


def check_then_benchmark(benchmark, op, provider_name, mode, shape, dtype_name, device, cache: ShapeCache):
    provider = op.providers[provider_name]
    reason = provider.unavailable(device)
    if reason:
        pytest.skip(reason)
    key = (tuple(sorted(shape.items())), dtype_name)
    inputs = cache.get(key, "inputs", lambda: op.make_inputs(shape, DTYPES[dtype_name], device, 0))
    reference = cache.get(key, "reference", lambda: op.reference(inputs))
    outputs = {} if provider.floor else op.closure(provider, inputs, mode, upstream="check")()
    errors = {k: relative_error(outputs[k], reference[k]) for k in outputs}
    tol = REL_TOL[DTYPES[dtype_name]]
    # no speed figure for a wrong answer: the benchmark does not run if this fails
    assert all(e <= tol for e in errors.values()), f"{provider_name} {mode} disagrees with eager: {errors}"
    fn = op.closure(provider, inputs, mode, upstream="time")
    benchmark.extra_info.update({"errors": errors, "shape": shape, "dtype": dtype_name, "device": str(device)})
    if device.type == "cuda":
        torch.cuda.synchronize()

        def timed():
            fn()
            torch.cuda.synchronize()
    else:
        timed = fn
    setup = getattr(fn, "prepare", None)
    rounds = 10 if device.type == "cuda" else 3
    benchmark.pedantic(timed, setup=setup, rounds=rounds, iterations=1, warmup_rounds=1)
