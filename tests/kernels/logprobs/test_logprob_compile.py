"""Every shipped kernel config compiles for sm_80 and sm_90 with no register spills and tensor-core MMAs.

No GPU needed: `compile_logprob_kernels.py` runs `triton.compile` against a `GPUTarget` in a subprocess with
TRITON_INTERPRET=0 (this session's kernels are interpreter objects) and runs ptxas -v on the PTX.
Every config (default and autotune candidates) is built for its target in bf16; the defaults in fp16 too, and
with every combination of the sampled-distribution features and int64 arguments (see `_variants`).
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


# The sampled-distribution features (T: kept-set threshold, S: soft-cap, R: per-row scale), every combination.
FEATURES = ("T", "S", "R", "TS", "TR", "SR", "TSR")


def _variants(kernel: str) -> list[tuple[str, str]]:
    """(dtype, variant) builds of a kernel's default config beyond the plain bf16/fp16 ones.

    Every feature combination the launcher sends to that config, and "L": every integer argument as int64
    (Triton's specialisation of an argument ≥ 2³¹), plain and with every feature.
    """
    if kernel.endswith("_f32head"):
        return [(dt, f) for dt in ("bf16+f32head", "fp16+f32head") for f in ("", "TSR")] + [
            ("bf16+f32head", f) for f in (*FEATURES[:-1], "L", "TSRL")
        ]
    if kernel == "logprob_dz_sampled":
        return [("bf16", f) for f in (*FEATURES, "TSRL")] + [("fp16", "TSR")]
    if kernel == "logprob_fwd":  # the forward keeps its config with the features on
        return [("bf16", f) for f in (*FEATURES, "L", "TSRL")] + [("fp16", "TSR")]
    return [("bf16", "L")]


def _plan():
    plan = []
    for kernel, defaults in configs.DEFAULT_CONFIGS.items():
        for arch in (80, 90):
            for cfg in configs.shipped_configs(kernel, arch):
                is_default = configs.config_key(cfg) == configs.config_key(defaults[arch])
                if kernel in ("logprob_fwd", "logprob_dz"):
                    dtypes = ("bf16", "fp16") if is_default else ("bf16",)
                    plan += [(kernel, _config_id(cfg), arch, dtype, "") for dtype in dtypes]
                if is_default:
                    plan += [(kernel, _config_id(cfg), arch, dt, v) for dt, v in _variants(kernel)]
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
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {(r["kernel"], r["config"], r["arch"], r["dtype"], r["variant"]): r for r in rows}


def _plan_id(p) -> str:
    return "-".join(str(x) for x in p if x != "")


@pytest.mark.slow  # the builds run in a subprocess
@pytest.mark.parametrize("kernel, config, arch, dtype, variant", PLAN, ids=[_plan_id(p) for p in PLAN])
def test_compiles_without_spills_on_tensor_cores(builds, kernel, config, arch, dtype, variant):
    row = builds[(kernel, config, arch, dtype, variant)]
    assert row["spill_stores"] == 0 and row["spill_loads"] == 0, row
    if dtype.endswith("+f32head"):
        # an IEEE float32 dot has no tensor-core instruction: it must not silently take TF32 ones either
        assert row["wgmma"] == 0 and row["mma"] == 0, row
    elif arch == 90:
        assert row["wgmma"] > 0, f"no wgmma in the sm_90 PTX: {row}"
    else:
        assert row["mma"] > 0, f"no mma.sync in the sm_80 PTX: {row}"
    assert row["shared"] <= SHARED_LIMIT[arch], row
    # The K-loop loads must be software-pipelined (async copies), or the tensor cores wait on memory.
    assert row["async_copies"] > 0, row
