"""Every shipped kernel config compiles for sm_80 and sm_90 with no register spills and tensor-core MMAs.

No GPU needed: `compile_kernels.py` runs `triton.compile` against a `GPUTarget` in a subprocess with
TRITON_INTERPRET=0 (this session's kernels are interpreter objects) and runs ptxas -v on the PTX.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastrl.kernels import configs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# Shared memory one block may use: 163 KiB on sm_80 (A100), 227 KiB on sm_90 (H100/H200).
SHARED_LIMIT = {80: 166912, 90: 232448}
BUILDS = [(name, arch, dtype) for name in configs.DEFAULT_CONFIGS for arch in (80, 90) for dtype in ("bf16", "fp16")]


def _compile_api_missing() -> str | None:
    try:
        import triton
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.backends.nvidia import compiler  # noqa: F401
    except ImportError as err:
        return f"this triton has no offline CUDA compile API ({err})"
    if not hasattr(triton.compiler, "ASTSource"):
        return f"triton {triton.__version__} has no triton.compiler.ASTSource"
    return None


@pytest.fixture(scope="module")
def builds():
    missing = _compile_api_missing()
    if missing:
        pytest.skip(missing)
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, str(HERE / "compile_kernels.py")], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {(r["kernel"], r["arch"], r["dtype"]): r for r in rows}


@pytest.mark.parametrize("kernel, arch, dtype", BUILDS, ids=[f"{k}-sm{a}-{d}" for k, a, d in BUILDS])
def test_compiles_without_spills_on_tensor_cores(builds, kernel, arch, dtype):
    row = builds[(kernel, arch, dtype)]
    assert row["config"] == {
        **configs.DEFAULT_CONFIGS[kernel][arch].kwargs,
        "num_warps": configs.DEFAULT_CONFIGS[kernel][arch].num_warps,
        "num_stages": configs.DEFAULT_CONFIGS[kernel][arch].num_stages,
    }
    assert row["spill_stores"] == 0 and row["spill_loads"] == 0, row
    if arch == 90:
        assert row["wgmma"] > 0, f"no wgmma in the sm_90 PTX: {row}"
    else:
        assert row["mma"] > 0, f"no mma.sync in the sm_80 PTX: {row}"
    assert row["shared"] <= SHARED_LIMIT[arch], row
    # The K-loop loads must be software-pipelined (async copies), or the tensor cores wait on memory.
    assert row["async_copies"] > 0, row
