"""Compile the gradient-in-forward epilogue kernels for sm_80 and sm_90 without a GPU; one JSON line per build.

Run by test_fused_kernel_compile.py in a subprocess with TRITON_INTERPRET=0: every constexpr flag and
∂z output dtype the launchers use is built with the shipped block sizes, and ptxas reports spills.
"""

import itertools
import json
import os
import re
import subprocess
import tempfile

os.environ["TRITON_INTERPRET"] = "0"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from fastrl.kernels import configs  # noqa: E402
from fastrl.kernels.fused_loss.epilogue import fold_dz_kernel, fold_stats_kernel  # noqa: E402

INTS = {"V", "stride_zn", "stride_dzn"}
I64_PTRS = {"targets"}


def build(kernel, arch, flags: dict, dz_dtype: str, block_v: int, num_warps: int, int_type: str = "i32"):
    jit_fn = kernel if hasattr(kernel, "arg_names") else kernel.fn
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(jit_fn.arg_names):
        if name in flags:
            signature[name], constexprs[name] = "constexpr", flags[name]
        elif name == "BLOCK_V":
            signature[name], constexprs[name] = "constexpr", block_v
        elif name == "tau_scalar":
            signature[name] = "fp32"
        elif name in INTS:
            signature[name] = int_type
            if name != "V":
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            dtype = "i64" if name in I64_PTRS else dz_dtype if name == "dz" else "fp32"
            signature[name] = "*" + dtype
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = triton.compiler.ASTSource(fn=jit_fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})


def ptxas_spills(ptx, arch):
    from triton.backends.nvidia import compiler as nv

    ptxas = nv.get_ptxas(arch).path if hasattr(nv, "get_ptxas") else nv._path_to_binary("ptxas")[0]
    gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        log = subprocess.run(
            [ptxas, "-v", f"--gpu-name={gpu}", path, "-o", path + ".o"], capture_output=True, text=True
        )
    if log.returncode:
        raise RuntimeError(log.stderr)
    regs = int(re.search(r"Used (\d+) registers", log.stderr).group(1))
    stores, loads = map(int, re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log.stderr).groups())
    return regs, stores, loads


def main():
    for arch, per_row, flag in itertools.product((80, 90), (False, True), (False, True)):
        variants = [
            (
                "fold_stats",
                fold_stats_kernel,
                dict(PER_ROW_TAU=per_row, HAS_ENTROPY=flag),
                "fp32",
                configs.FUSED_STATS_BLOCK_V,
                configs.FUSED_STATS_NUM_WARPS,
            ),
        ]
        for dz_dtype in ("fp32", "bf16", "fp16"):
            variants.append(
                (
                    "fold_dz",
                    fold_dz_kernel,
                    dict(PER_ROW_TAU=per_row, HAS_ENTROPY_GRAD=flag),
                    dz_dtype,
                    configs.FUSED_DZ_BLOCK_V,
                    configs.FUSED_DZ_NUM_WARPS,
                )
            )
        for name, kernel, flags, dz_dtype, block_v, warps in variants:
            regs, st, ld = ptxas_spills(build(kernel, arch, flags, dz_dtype, block_v, warps).asm["ptx"], arch)
            row = dict(kernel=name, arch=arch, dz_dtype=dz_dtype, **flags)
            print(json.dumps(dict(row, registers=regs, spill_stores=st, spill_loads=ld)), flush=True)


def main_int64():
    # every integer argument as int64 (Triton's specialisation of a value ≥ 2³¹), the heaviest flags
    for arch in (80, 90):
        for name, kernel, flags, block_v, warps in (
            ("fold_stats", fold_stats_kernel, dict(PER_ROW_TAU=True, HAS_ENTROPY=True), configs.FUSED_STATS_BLOCK_V,
             configs.FUSED_STATS_NUM_WARPS),
            ("fold_dz", fold_dz_kernel, dict(PER_ROW_TAU=True, HAS_ENTROPY_GRAD=True), configs.FUSED_DZ_BLOCK_V,
             configs.FUSED_DZ_NUM_WARPS),
        ):  # fmt: skip
            ptx = build(kernel, arch, flags, "bf16", block_v, warps, int_type="i64").asm["ptx"]
            regs, st, ld = ptxas_spills(ptx, arch)
            row = dict(kernel=name, arch=arch, dz_dtype="bf16", int64=True, **flags)
            print(json.dumps(dict(row, registers=regs, spill_stores=st, spill_loads=ld)), flush=True)


if __name__ == "__main__":
    main()
    main_int64()
