"""Compile every shipped kernel config for sm_80 and sm_90 without a GPU; print one JSON line per build.

Run by test_logprob_compile.py in a subprocess with TRITON_INTERPRET=0 (under the interpreter the kernels are
not compilable objects). Pointers and the wide strides get the 16-divisibility that the launcher's
specialization gives them at real shapes (D = 4096), unit strides are constants, as at runtime.

A build's variant names the optional constexpr features it turns on: T (kept-set threshold θ), S (soft-cap),
R (per-row scale), and L: every integer argument specialised as int64, as Triton does for a value ≥ 2³¹.
Its dtype is the hidden's, `+f32head` for a float32 weight / bias / slab (in-kernel upcast, IEEE dot).
"""

import json
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from fastrl.kernels import configs  # noqa: E402
from fastrl.kernels.logprobs.bwd import logprob_dz_kernel  # noqa: E402
from fastrl.kernels.logprobs.fwd import logprob_fwd_kernel  # noqa: E402

KERNELS = {
    "logprob_fwd": logprob_fwd_kernel,
    "logprob_dz": logprob_dz_kernel,
    "logprob_dz_sampled": logprob_dz_kernel,
    "logprob_fwd_f32head": logprob_fwd_kernel,
    "logprob_dz_f32head": logprob_dz_kernel,
}
INPUT_PTRS = {"hidden", "weight", "bias", "dz"}
I64_PTRS = {"targets"}
FLOAT_PTRS = {"part_m", "part_s", "part_t", "target_z", "lse", "entropy", "grad_logp", "grad_entropy"}
FEATURE_PTRS = {"theta": "T", "row_scale": "R"}
FLOATS = {"inv_temperature", "softcap"}
UNIT_STRIDES = {"stride_hd", "stride_wd", "stride_b", "stride_y"}
DIVISIBLE_INTS = {"D", "stride_hn", "stride_wv", "stride_dzn"}
FLAGS = {"HAS_BIAS": True, "HAS_ENTROPY": True, "HAS_ENTROPY_GRAD": True, "DOT_PRECISION": None, "DOT_UPCAST": False}


def build(jit_fn, cfg, arch, dtype, variant=""):
    names = jit_fn.arg_names
    h_dtype, _, head = dtype.partition("+")
    w_dtype = "fp32" if head == "f32head" else h_dtype
    flags = dict(FLAGS, HAS_THRESHOLD="T" in variant, HAS_SOFTCAP="S" in variant, HAS_ROW_SCALE="R" in variant)
    if head == "f32head":
        flags.update(DOT_PRECISION="ieee", DOT_UPCAST=True)
    int_type = "i64" if "L" in variant else "i32"
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(names):
        if name in FEATURE_PTRS and FEATURE_PTRS[name] not in variant:
            signature[name], constexprs[name] = "constexpr", None
        elif name in INPUT_PTRS or name in I64_PTRS or name in FLOAT_PTRS or name in FEATURE_PTRS:
            ty = "i64" if name in I64_PTRS else "fp32"
            signature[name] = "*" + (h_dtype if name == "hidden" else w_dtype if name in INPUT_PTRS else ty)
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in FLOATS:
            signature[name] = "fp32"
        elif name in UNIT_STRIDES:
            signature[name], constexprs[name] = "constexpr", 1
        elif name in cfg.kwargs or name in flags:
            signature[name], constexprs[name] = "constexpr", cfg.kwargs.get(name, flags.get(name))
        else:
            signature[name] = int_type
            if name in DIVISIBLE_INTS:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = triton.compiler.ASTSource(fn=jit_fn, signature=signature, constexprs=constexprs, attrs=attrs)
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts)


def ptxas_path(arch):
    from triton.backends.nvidia import compiler as nv

    tool = nv.get_ptxas(arch) if hasattr(nv, "get_ptxas") else nv._path_to_binary("ptxas")
    return tool.path if hasattr(tool, "path") else tool[0]  # triton >= 3.4: NvidiaTool; older: (path, version)


def ptxas_report(ptx, arch):
    """(registers, spill store bytes, spill load bytes) from `ptxas -v` on the kernel's PTX."""
    gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        cmd = [ptxas_path(arch), "-v", f"--gpu-name={gpu}", path, "-o", path + ".o"]
        log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    stores, loads = map(int, re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log).groups())
    return regs, stores, loads


def config_id(cfg) -> str:
    k = cfg.kwargs
    return f"{k['BLOCK_N']}x{k['BLOCK_V']}x{k['BLOCK_D']}-w{cfg.num_warps}-s{cfg.num_stages}"


def main(plan):
    """`plan`: [kernel, config_id, arch, dtype, variant] entries; configs come from configs.shipped_configs."""
    for name, cfg_id, arch, dtype, variant in plan:
        cfg = next(c for c in configs.shipped_configs(name, arch) if config_id(c) == cfg_id)
        compiled = build(KERNELS[name].fn, cfg, arch, dtype, variant)
        ptx = compiled.asm["ptx"]
        regs, spill_st, spill_ld = ptxas_report(ptx, arch)
        row = {
            "kernel": name,
            "config": cfg_id,
            "arch": arch,
            "dtype": dtype,
            "variant": variant,
            "registers": regs,
            "spill_stores": spill_st,
            "spill_loads": spill_ld,
            "shared": compiled.metadata.shared,
            "wgmma": ptx.count("wgmma.mma_async"),
            "mma": len(re.findall(r"\bmma\.sync", ptx)),
            "async_copies": compiled.asm["ttgir"].count("async_copy_global_to_local"),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
