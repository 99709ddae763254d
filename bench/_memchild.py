"""One configuration's peak CPU memory, measured in a fresh interpreter.

Started by `harness.cpu_peak_in_subprocess` with a JSON spec (op, provider, shape, dtype, mode,
seed; for a floor, the tilings its parent picked, so the child measures those); prints one JSON line:
the peak RSS over the baseline (inputs allocated, warm-up done) and the bytes of the gradients the op
must return, which the report subtracts to get the extra memory.

With `outputs_path` in the spec the measured call is also the checked and the first timed one: it runs with
the `check` upstream, its outputs are saved there for the parent to compare with its reference, and `reps - 1`
more calls are timed (the report gains `seconds`, one per call). A large point then costs one call, not three.
"""

import importlib
import json
import sys
import time

import torch

from bench.floors import CHOSEN
from bench.harness import DTYPES, rss_peak_bytes


def main(spec: dict) -> dict:
    op = importlib.import_module(f"bench.bench_{spec['op']}").OP
    provider = op.providers[spec["provider"]]
    device = torch.device("cpu")
    for n, d, v, kind, layout, rows in spec.get("floor_tilings", ()):
        CHOSEN[n, d, v, kind] = (layout, rows)
    dtype = DTYPES[spec["dtype"]]
    if not provider.compiles:
        # thread pools, lazy imports and library handles come up here, not in the measured call
        tiny = op.make_inputs(op.tiny_shape, dtype, device, spec["seed"])
        op.closure(provider, tiny, spec["mode"], upstream="time")()
        del tiny
    inputs = op.make_inputs(spec["shape"], dtype, device, spec["seed"])
    checked = "outputs_path" in spec
    fn = op.closure(provider, inputs, spec["mode"], upstream="check" if checked else "time")
    if provider.compiles:
        fn()  # compilation at this very shape; its memory is not the op's
    if not checked:
        return {"peak_bytes": rss_peak_bytes(fn), "grad_bytes": op.grad_bytes(inputs, spec["mode"])}
    kept, seconds = [], []

    def timed():
        start = time.perf_counter()
        kept.append(fn())
        seconds.append(time.perf_counter() - start)
        return None

    peak = rss_peak_bytes(timed)
    torch.save({k: v.detach() for k, v in kept.pop().items()}, spec["outputs_path"])
    again = op.closure(provider, inputs, spec["mode"], upstream="time")
    for _ in range(spec.get("reps", 1) - 1):
        start = time.perf_counter()
        again()
        seconds.append(time.perf_counter() - start)
    return {"peak_bytes": peak, "grad_bytes": op.grad_bytes(inputs, spec["mode"]), "seconds": seconds}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
