"""Compile the policy-loss kernels for sm_80 and sm_90 without a GPU; print one JSON line per build.

Run by test_policy_kernel_compile.py in a subprocess with TRITON_INTERPRET=0. The interpreter runs
the kernels as NumPy and forgives what the compiler rejects (scalar/tensor type mixes inside
constexpr branches, dtype casts), so every flag combination that changes the code is built here.
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
from fastrl.kernels.policy.bwd import policy_bwd_kernel  # noqa: E402
from fastrl.kernels.policy.fwd import policy_fwd_kernel  # noqa: E402
from fastrl.kernels.policy.params import NUM_STATS, STAT_CONSTEXPRS  # noqa: E402

OPTIONAL = ("old", "ref", "weight", "entropy")
FLOATS = ("eps_low", "eps_high", "dual_clip", "beta", "kl_clip", "entropy_coef", "tau_pos", "tau_neg")


def build(
    kernel, arch, present: bool, ratio: int, pg: int, per_token: bool, kl: int, kl_extra: bool, logp_dtype: str,
    t_type: str = "i32",
):  # fmt: skip
    """ratio: 0 token, 1 sequence, 2 sequence-token; pg: 0 clip, 1 SAPO, 2 linear; kl_extra: clamped and × r."""
    jit_fn = kernel.fn
    signature, constexprs, attrs = {}, {}, {}
    flags = dict(
        HAS_OLD=present,
        HAS_REF=present,
        HAS_WEIGHT=present,
        HAS_ENTROPY=present,
        HAS_DUAL=present and pg == 0,
        ADV_PER_TOKEN=per_token,
        PG=pg,
        SEQ_RATIO=ratio != 0,
        SEQ_GRAD=ratio == 1,
        KL=kl,
        HAS_KL_CLIP=kl_extra,
        KL_BIAS=kl_extra,
        NUM_STATS=NUM_STATS,
        **STAT_CONSTEXPRS,
        BLOCK_T=configs.POLICY_MAX_BLOCK_T,
    )
    for i, name in enumerate(jit_fn.arg_names):
        if name in OPTIONAL and not present:
            signature[name], constexprs[name] = "constexpr", None
        elif name in flags:
            signature[name], constexprs[name] = "constexpr", flags[name]
        elif name in FLOATS:
            signature[name] = "fp32"
        elif name == "T":
            signature[name] = t_type
        elif name == "mask":
            signature[name] = "*u8"
        elif name in ("logp", "old", "ref", "entropy", "d_logp", "d_entropy"):
            signature[name] = "*" + logp_dtype
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "*fp32"
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = triton.compiler.ASTSource(fn=jit_fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": configs.POLICY_NUM_WARPS})


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


COMBOS = (
    # every ratio level × policy term × advantage shape, with the heaviest KL (k3, clamped, × r)
    [(True, r, pg, p, 3, True, "fp32") for r, pg, p in itertools.product((0, 1, 2), (0, 1, 2), (False, True))]
    # every other KL estimator, plain and clamped × r
    + [(True, 1, 0, False, k, x, "fp32") for k, x in itertools.product((1, 2, 4, 5, 6), (False, True))]
    + [(False, 0, 0, False, 3, False, "fp32"), (False, 1, 0, False, 3, False, "fp32")]
    + [(True, 1, 1, True, 3, True, "bf16")]
)
SM80 = COMBOS[-3:]


def main():
    print(json.dumps(dict(expected=2 * (len(COMBOS) + len(SM80)) + 2 * 2)), flush=True)
    for kname, kernel in (("policy_fwd", policy_fwd_kernel), ("policy_bwd", policy_bwd_kernel)):
        for arch, arch_combos in ((90, COMBOS), (80, SM80)):
            for present, ratio, pg, per_token, kl, kl_extra, dt in arch_combos:
                ptx = build(kernel, arch, present, ratio, pg, per_token, kl, kl_extra, dt).asm["ptx"]
                regs, st, ld = ptxas_spills(ptx, arch)
                row = dict(kernel=kname, arch=arch, optional=present, ratio=ratio, pg=pg, per_token=per_token, kl=kl,
                           kl_extra=kl_extra, dtype=dt)  # fmt: skip
                print(json.dumps(dict(row, registers=regs, spill_stores=st, spill_loads=ld)), flush=True)
        for arch in (80, 90):  # T as int64 (Triton's specialisation of a value ≥ 2³¹), the heaviest flags
            ptx = build(kernel, arch, True, 1, 1, True, 3, True, "fp32", t_type="i64").asm["ptx"]
            regs, st, ld = ptxas_spills(ptx, arch)
            row = dict(kernel=kname, arch=arch, optional=True, ratio=1, pg=1, per_token=True, kl=3, int64=True)
            print(json.dumps(dict(row, registers=regs, spill_stores=st, spill_loads=ld)), flush=True)


if __name__ == "__main__":
    main()
