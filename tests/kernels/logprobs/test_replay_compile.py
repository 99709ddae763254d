"""The replay kernels compile for sm_80 and sm_90 with no register spills and no atomic instructions.

No GPU needed: `compile_replay_kernels.py` runs `triton.compile` against a `GPUTarget` in a subprocess with
TRITON_INTERPRET=0 and runs ptxas -v on the PTX. Each kernel is built in bf16, fp16, fp32 and bf16 with a
float32 head, with every optional feature on (and off in bf16), and with int64 integer arguments.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SHARED_LIMIT = {80: 166912, 90: 232448}
_FULL = {"replay_fwd": "BS", "replay_dh": "SE", "replay_dw": "B"}

PLAN = [
    (kernel, arch, dtype, variant)
    for kernel, full in _FULL.items()
    for arch in (80, 90)
    for dtype, variant in [
        ("bf16", ""),
        ("bf16", full),
        ("fp16", full),
        ("fp32", full),
        ("bf16+f32head", full),
        ("bf16", full + "L"),
    ]  # fmt: skip
]


@pytest.fixture(scope="module")
def builds():
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, str(HERE / "compile_replay_kernels.py"), json.dumps(PLAN)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {(r["kernel"], r["arch"], r["dtype"], r["variant"]): r for r in rows}


@pytest.mark.slow
@pytest.mark.parametrize("kernel, arch, dtype, variant", PLAN, ids=["-".join(map(str, p)).strip("-") for p in PLAN])
def test_replay_kernels_compile_without_spills_or_atomics(builds, kernel, arch, dtype, variant):
    row = builds[(kernel, arch, dtype, variant)]
    assert row["spill_stores"] == 0 and row["spill_loads"] == 0, row
    assert row["atomics"] == 0, row
    assert row["shared"] <= SHARED_LIMIT[arch], row
