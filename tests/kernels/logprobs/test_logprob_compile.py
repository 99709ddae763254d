"""Every shipped kernel config compiles for sm_80 and sm_90 with no register spills and tensor-core MMAs.

No GPU needed: `compile_logprob_kernels.py` runs `triton.compile` against a `GPUTarget` in a subprocess with
TRITON_INTERPRET=0 (this session's kernels are interpreter objects) and runs ptxas -v on the PTX.
Every config (default and autotune candidates) is built for its target in bf16; the defaults in fp16 too.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastrl.kernels import configs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
# Shared memory one block may use: 163 KiB on sm_80 (A100), 227 KiB on sm_90 (H100/H200).
SHARED_LIMIT = {80: 166912, 90: 232448}


def _config_id(cfg) -> str:
    k = cfg.kwargs
    return f"{k['BLOCK_N']}x{k['BLOCK_V']}x{k['BLOCK_D']}-w{cfg.num_warps}-s{cfg.num_stages}"


def _plan():
    plan = []
    for kernel, defaults in configs.DEFAULT_CONFIGS.items():
        for arch in (80, 90):
            for cfg in configs.shipped_configs(kernel, arch):
                is_default = configs.config_key(cfg) == configs.config_key(defaults[arch])
                plan += [
                    (kernel, _config_id(cfg), arch, dtype) for dtype in (("bf16", "fp16") if is_default else ("bf16",))
                ]
    return plan


PLAN = _plan()


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
        pytest.fail(missing)  # the test extra installs a triton that has it: never skip
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, str(HERE / "compile_logprob_kernels.py"), json.dumps(PLAN)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {(r["kernel"], r["config"], r["arch"], r["dtype"]): r for r in rows}


@pytest.mark.parametrize("kernel, config, arch, dtype", PLAN, ids=["-".join(map(str, p)) for p in PLAN])
def test_compiles_without_spills_on_tensor_cores(builds, kernel, config, arch, dtype):
    row = builds[(kernel, config, arch, dtype)]
    assert row["spill_stores"] == 0 and row["spill_loads"] == 0, row
    if arch == 90:
        assert row["wgmma"] > 0, f"no wgmma in the sm_90 PTX: {row}"
    else:
        assert row["mma"] > 0, f"no mma.sync in the sm_80 PTX: {row}"
    assert row["shared"] <= SHARED_LIMIT[arch], row
    # The K-loop loads must be software-pipelined (async copies), or the tensor cores wait on memory.
    assert row["async_copies"] > 0, row
