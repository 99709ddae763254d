"""The shared benchmark harness: timing, peak memory, correctness gates, the run's environment.

Every op file (`bench_<op>.py`) hands the harness an `Op`: how to build inputs for a shape, how to
turn (provider, inputs, mode) into a closure that runs one iteration, and how to check a provider's
outputs against the eager reference in the same run. The harness then, per configuration:

1. runs the correctness check (that run doubles as the first warm-up); a failed check is recorded as
   FAIL and gets no time and no memory figure;
2. times the closure: median and 20/80 quantiles (CUDA events on GPU, `perf_counter` on CPU);
3. measures peak extra memory: `torch.cuda.max_memory_allocated` on GPU; on CPU the peak RSS of a
   fresh subprocess (`bench/_memchild.py`) over its baseline once the inputs exist.
"""

import gc
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from bench.runenv import environment, load_average, memory_child_env  # noqa: F401  (the run's environment, re-exported)

MODES = ("fwd", "bwd", "fwd+bwd")
# Relative L2 error allowed against the eager reference, per input dtype. fp32 paths differ from eager
# only in summation order; bf16/fp16 eager rounds the logits to the input dtype, fused kernels do not.
REL_TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 1e-2}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Result:
    op: str
    provider: str
    mode: str
    shape: dict
    dtype: str
    status: str  # "ok", "ref" (the eager baseline itself), "floor", "FAIL", "n/a", "error", "OOM", "skipped"
    note: str = ""
    errors: dict = field(default_factory=dict)  # tensor name -> relative L2 error vs eager
    median_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    reps: int = 0
    peak_mib: float | None = None  # peak memory over the baseline with inputs allocated
    extra_mib: float | None = None  # peak_mib minus the gradient buffers the op must return
    tflops: float | None = None  # nominal FLOPs (docs/math.md §1 floor) / median time
    pct_ceiling: float | None = None  # tflops / the bf16 matmul rate measured in the same run
    live_rows: int | None = None  # the rows every provider must score (not ignored / masked), from the inputs

    @property
    def measured(self) -> bool:
        return self.status in ("ok", "ref", "floor")

    def to_json(self) -> dict:
        return asdict(self)


def quantiles(samples_ms: list[float]) -> tuple[float, float, float]:
    """(median, 20th, 80th percentile) with linear interpolation; one sample gives it three times."""
    if len(samples_ms) == 1:
        return samples_ms[0], samples_ms[0], samples_ms[0]
    deciles = statistics.quantiles(samples_ms, n=10, method="inclusive")
    return statistics.median(samples_ms), deciles[1], deciles[7]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_once(fn, device: torch.device) -> float:
    """Milliseconds of one call of `fn`; `fn.prepare()`, when `fn` has one, runs untimed first."""
    prepare = getattr(fn, "prepare", None)
    if prepare is not None:
        prepare()
    synchronize(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def time_closure(fn, device: torch.device, warmup: int, reps: int, budget_s: float) -> list[float]:
    """`warmup` untimed calls, then up to `reps` timed ones (at least 2, and fewer than `reps` once
    `budget_s` of timed calls has been spent)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples: list[float] = []
    while len(samples) < reps and (len(samples) < 2 or sum(samples) / 1e3 < budget_s):
        samples.append(time_once(fn, device))
    return samples


def cuda_peak_bytes(fn, device: torch.device) -> int:
    """Peak bytes allocated by one call of `fn` above what was allocated before it (after `fn.prepare()`)."""
    if hasattr(fn, "prepare"):
        fn.prepare()
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del out
    return peak


def _proc_status_kib(key: str) -> int | None:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def rss_peak_bytes(fn) -> int:
    """Peak RSS of this process during one call of `fn`, over its RSS just before the call.

    Resets the kernel's high-water mark (`/proc/self/clear_refs`, Linux ≥ 4.0) so that earlier work
    (inputs, warm-up) does not count; without it, falls back to `ru_maxrss`, which is only right when
    nothing before the call came near the peak.
    """
    if hasattr(fn, "prepare"):
        fn.prepare()
    gc.collect()
    base = _proc_status_kib("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    out = fn()
    if reset:
        peak = _proc_status_kib("VmHWM")
    else:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    del out
    return max(0, peak - base) * 1024


def extra_memory_fields(report: dict) -> dict:
    """A bench row's memory fields from a `cpu_peak_in_subprocess` report: `extra_mib` (the peak less the
    gradients returned) or `memory_error`."""
    if "peak_bytes" in report:
        return {"extra_mib": (report["peak_bytes"] - report["grad_bytes"]) / 2**20}
    return {"memory_error": report.get("error")}


def cpu_peak_in_subprocess(spec: dict, timeout_s: float = 900) -> dict:
    """Run one configuration in a fresh interpreter (`python -m bench._memchild`) and return its report.

    glibc keeps freed small blocks and reuses them without touching new pages, so the child is started
    with a fixed mmap threshold: every block of 128 KiB or more is mapped on allocation and unmapped on
    free, and RSS follows what is live.
    """
    env = memory_child_env()
    env.pop("TRITON_INTERPRET", None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "bench._memchild", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        cwd=root,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"memory child exited {proc.returncode}: {' | '.join(tail)}"}
    return json.loads(lines[-1])


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖actual − expected‖₂ / ‖expected‖₂ in float64; inf if `actual` has a non-finite value."""
    a, e = actual.detach().double(), expected.detach().double()
    if not torch.isfinite(a).all():
        return float("inf")
    denom = e.norm().item()
    diff = (a - e).norm().item()
    return diff / denom if denom > 0 else diff


def matmul_tflops(n: int, d: int, v: int, device: torch.device, dtype=torch.bfloat16, reps: int = 10) -> float:
    """The dense matmul rate on this device for the op's own sizes: `[N, D] @ [D, V]` in `dtype`."""
    a = torch.randn(n, d, device=device, dtype=dtype)
    b = torch.randn(d, v, device=device, dtype=dtype)
    samples = time_closure(lambda: a @ b, device, warmup=3, reps=reps, budget_s=5.0)
    return 2 * n * d * v / (statistics.median(samples) / 1e3) / 1e12


@dataclass(frozen=True)
class Settings:
    warmup: int = 1  # untimed calls after the correctness run (which is itself a full call)
    reps: int = 5  # timed calls at most
    budget_s: float = 10.0  # stop timing a configuration after this many seconds (at least 2 calls)
    memory: bool = True  # measure peak memory (a fresh subprocess per configuration on CPU)
    seed: int = 0


class ShapeCache:
    """Inputs, eager reference and matmul ceiling for one (shape, dtype) at a time: built on first use,
    dropped when the next shape arrives, so a large GPU shape never coexists with the previous one."""

    def __init__(self):
        self.key = None
        self.items: dict = {}

    def get(self, key, name: str, build):
        if key != self.key:
            self.items.clear()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            self.key = key
        if name not in self.items:
            self.items[name] = build()
        return self.items[name]


def _is_oom(exc: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", MemoryError)
    return isinstance(exc, (oom, MemoryError)) or "out of memory" in str(exc).lower()


def _failure(res: Result, exc: BaseException, prefix: str = "") -> Result:
    text = str(exc).strip()
    res.status = "OOM" if _is_oom(exc) else "error"
    res.note = f"{prefix}{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"
    res.median_ms = res.p20_ms = res.p80_ms = None
    res.reps = 0
    return res


def _check(op, provider, shape, dtype_name, mode, device, settings, cache):
    """The correctness gate: (Result with status and errors, closure to time or None if it must not be)."""
    res = Result(op.name, provider.name, mode, dict(shape), dtype_name, status="ok")
    reason = provider.unavailable(device)
    if reason:
        res.status, res.note = "n/a", reason
        return res, None
    dtype = DTYPES[dtype_name]
    key = (tuple(sorted(shape.items())), dtype_name)
    try:
        inputs = cache.get(key, "inputs", lambda: op.make_inputs(shape, dtype, device, settings.seed))
        reference = cache.get(key, "reference", lambda: op.reference(inputs))
        res.live_rows = op.live_rows(inputs) if hasattr(op, "live_rows") else None
    except Exception as exc:  # the eager reference itself did not fit: nothing can be checked at this shape
        return _failure(res, exc, "eager reference failed: "), None
    if provider.floor:
        res.status = "floor"
        fn = op.closure(provider, inputs, mode, upstream="time")
        try:
            fn()  # untimed: a floor picks its best tiling on its first call at a shape
        except Exception as exc:
            return _failure(res, exc), None
        return res, fn
    try:
        outputs = op.closure(provider, inputs, mode, upstream="check")()
        res.errors = {k: relative_error(outputs[k], reference[k]) for k in outputs}
        del outputs
    except Exception as exc:
        return _failure(res, exc), None
    tol = REL_TOL[dtype]
    bad = {k: e for k, e in res.errors.items() if not e <= tol}
    if bad:
        res.status = "FAIL"
        res.note = "; ".join(f"{k} rel err {e:.2e} > {tol:.0e}" for k, e in bad.items())
        return res, None
    if provider.name == op.baseline:
        res.status = "ref"
    return res, op.closure(provider, inputs, mode, upstream="time")


def run_group(
    op,
    providers,
    shape: dict,
    dtype_name: str,
    mode: str,
    device: torch.device,
    settings: Settings,
    cache: ShapeCache,
    memory_for=None,
) -> list[Result]:
    """Check every provider, then time the ones that passed in interleaved rounds (one call of each per
    round), so load from other processes falls on all providers alike; then measure memory.

    `memory_for(provider) -> bool` narrows which providers get a memory measurement (default: all when
    `settings.memory`). Never raises for a provider's fault: failures become FAIL / error / OOM rows.
    """
    checked = [(p,) + _check(op, p, shape, dtype_name, mode, device, settings, cache) for p in providers]
    live = [(p, res, fn) for p, res, fn in checked if fn is not None]
    samples = {id(res): [] for _, res, _ in live}
    for p, res, fn in list(live):
        try:
            for _ in range(settings.warmup):
                fn()
        except Exception as exc:
            _failure(res, exc)
            live.remove((p, res, fn))
    for _ in range(settings.reps):
        for p, res, fn in list(live):
            got = samples[id(res)]
            if len(got) >= 2 and sum(got) / 1e3 > settings.budget_s:
                continue
            try:
                got.append(time_once(fn, device))
            except Exception as exc:
                _failure(res, exc)
                live.remove((p, res, fn))
    key = (tuple(sorted(shape.items())), dtype_name)
    for p, res, fn in live:
        got = samples[id(res)]
        res.median_ms, res.p20_ms, res.p80_ms = quantiles(got)
        res.reps = len(got)
        if device.type == "cuda":
            n, d, v = op.matmul_dims(shape)
            ceiling = cache.get(key, "ceiling", lambda: matmul_tflops(n, d, v, device))
            res.tflops = op.flops(shape, mode) / (res.median_ms / 1e3) / 1e12
            res.pct_ceiling = 100 * res.tflops / ceiling
        if not settings.memory or (memory_for is not None and not memory_for(p)):
            continue
        if device.type == "cuda":
            try:
                peak = cuda_peak_bytes(fn, device)
            except Exception as exc:
                res.note = f"memory not measured: {type(exc).__name__}"
                continue
            res.peak_mib = peak / 2**20
            res.extra_mib = (peak - op.grad_bytes(cache.get(key, "inputs", None), mode)) / 2**20
        else:
            spec = {
                "op": op.name,
                "provider": p.name,
                "shape": shape,
                "dtype": dtype_name,
                "mode": mode,
                "seed": settings.seed,
            }
            if p.floor:  # the child measures the tiling timed here, without calibrating again
                from bench.floors import CHOSEN

                spec["floor_tilings"] = [list(k) + list(v) for k, v in CHOSEN.items()]
            child = cpu_peak_in_subprocess(spec)
            if "error" in child:
                res.note = child["error"]
            else:
                res.peak_mib = child["peak_bytes"] / 2**20
                res.extra_mib = (child["peak_bytes"] - child["grad_bytes"]) / 2**20
    del live
    return [res for _, res, _ in checked]


def run_config(
    op, provider, shape: dict, dtype_name: str, mode: str, device: torch.device, settings: Settings, cache: ShapeCache
) -> Result:
    """One provider alone (see `run_group`)."""
    return run_group(op, [provider], shape, dtype_name, mode, device, settings, cache)[0]
