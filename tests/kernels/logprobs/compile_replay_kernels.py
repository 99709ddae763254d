"""Compile the replay kernels for sm_80 and sm_90 without a GPU; print one JSON line per build.

Run by test_replay_compile.py in a subprocess with TRITON_INTERPRET=0. A build names its hidden dtype (`+f32head`:
a float32 weight / bias) and its variant: B (bias, or d_bias), S (soft-cap), E (the entropy's gradient), L (every
integer argument specialised as int64, as Triton does for a value ≥ 2³¹).
"""

import json
import os
import re
import sys

os.environ["TRITON_INTERPRET"] = "0"

import triton  # noqa: E402
from compile_logprob_kernels import ptxas_report  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from fastrl.kernels import configs  # noqa: E402
from fastrl.kernels.logprobs.replay_bwd import replay_dh_kernel, replay_dw_kernel  # noqa: E402
from fastrl.kernels.logprobs.replay_fwd import replay_fwd_kernel  # noqa: E402

KERNELS = {"replay_fwd": replay_fwd_kernel, "replay_dh": replay_dh_kernel, "replay_dw": replay_dw_kernel}
I64_PTRS = {"ids", "offsets", "targets", "seg_starts", "seg_ids", "order", "rows"}
F32_PTRS = {"scale", "x_out", "x", "logp_out", "lse_out", "entropy_out", "lse", "entropy", "grad_logp", "c_out", "c",
            "d_hidden", "d_weight"}  # fmt: skip
OPTIONAL = {"bias": "B", "d_bias": "B", "grad_entropy": "E"}
UNIT_STRIDES = {"stride_hd", "stride_wd", "stride_b"}
DIVISIBLE_INTS = {"D", "stride_hn", "stride_wv", "stride_dhn", "stride_dwv"}


def build(jit_fn, cfg, arch, dtype, variant):
    h_dtype, _, head = dtype.partition("+")
    w_dtype = "fp32" if head == "f32head" else h_dtype
    flags = {"HAS_SOFTCAP": "S" in variant, "HAS_LOGP_GRAD": True, "HAS_ENTROPY_GRAD": "E" in variant}
    flags.update(HAS_BIAS="B" in variant, HAS_BIAS_GRAD="B" in variant)
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(jit_fn.arg_names):
        if name in OPTIONAL and OPTIONAL[name] not in variant:
            signature[name], constexprs[name] = "constexpr", None
        elif name in ("hidden", "weight", "bias", "d_bias") or name in I64_PTRS or name in F32_PTRS or name in OPTIONAL:
            ty = {"hidden": h_dtype, "weight": w_dtype, "bias": w_dtype}.get(
                name, "i64" if name in I64_PTRS else "fp32"
            )
            signature[name] = "*" + ty
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "softcap":
            signature[name] = "fp32"
        elif name in UNIT_STRIDES:
            signature[name], constexprs[name] = "constexpr", 1
        elif name in cfg.kwargs or name in flags:
            signature[name], constexprs[name] = "constexpr", cfg.kwargs.get(name, flags.get(name))
        else:
            signature[name] = "i64" if "L" in variant else "i32"
            if name in DIVISIBLE_INTS:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = triton.compiler.ASTSource(fn=jit_fn, signature=signature, constexprs=constexprs, attrs=attrs)
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts)


def main(plan):
    for name, arch, dtype, variant in plan:
        compiled = build(KERNELS[name].fn, configs.REPLAY_CONFIGS[name][arch], arch, dtype, variant)
        ptx = compiled.asm["ptx"]
        regs, spill_st, spill_ld = ptxas_report(ptx, arch)
        row = {"kernel": name, "arch": arch, "dtype": dtype, "variant": variant, "registers": regs,
               "spill_stores": spill_st, "spill_loads": spill_ld, "shared": compiled.metadata.shared,
               "atomics": len(re.findall(r"\b(?:atom|red)\.", ptx))}  # fmt: skip
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
