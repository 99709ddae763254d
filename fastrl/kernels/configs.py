"""Every launch constant and `triton.Config` of fastrl's Triton kernels, in one place (the PyTorch walks' chunk
budgets are in budgets.py, which imports no triton).

Log-prob kernels: each has one known-good default per GPU generation (sm_80: A100, sm_90: H100/H200); the
compile test builds each of them for both targets and checks for register spills and tensor-core
instructions. `FASTRL_AUTOTUNE=1` opts into autotuning over `AUTOTUNE_CONFIGS` instead, keyed on
the token count rounded up to a power of two (so a new N in the same bucket does not re-tune).
"""

import os

import torch
import triton

__all__ = [
    "AUTOTUNE_CONFIGS",
    "AUTOTUNE_KEYS",
    "BWD_SLAB_BYTES",
    "DEFAULT_CONFIGS",
    "FWD_INVARIANT_SPLITS",
    "FWD_MIN_SPLITS",
    "FWD_WAVES",
    "INVARIANT_GEMM_ROWS",
    "POLICY_MAX_BLOCK_T",
    "POLICY_MIN_BLOCK_T",
    "POLICY_NUM_WARPS",
    "REPLAY_CONFIGS",
    "alloc",
    "arch_of",
    "autotune_enabled",
    "config_key",
    "default_config",
    "kernel_and_kwargs",
    "logprob_kernel",
    "poison_outputs",
    "replay_config",
    "shipped_configs",
    "sm_count",
    "token_bucket",
]

# Bytes of the `[N, V_chunk]` gradient-of-logits slab the backward writes per vocab chunk. 256 MiB keeps
# the GEMMs large (V_chunk = 4096 columns at N = 32k in bf16) while staying a small, fixed workspace.
BWD_SLAB_BYTES = int(os.environ.get("FASTRL_BWD_SLAB_BYTES", 2**28))

# Programs the forward aims to launch (times the SM count) when N is small.
FWD_WAVES = 2
# Vocab splits of the forward at any N: a resident wave then covers SMs / 8 token blocks, whose
# hidden rows fit in L2 while the 8 splits stream disjoint vocab ranges (see logprobs/fwd.py).
FWD_MIN_SPLITS = 8
# Batch invariance (docs/math.md §1.2): the forward's vocab splits, whatever N and the SM count (2·FWD_MIN_SPLITS:
# 8 token blocks then fill a wave of 128 programs), and the row count of every d_hidden GEMM of the backward
# (a library GEMM's per-row result depends on its shape, never on the row's place in it).
FWD_INVARIANT_SPLITS = 16
INVARIANT_GEMM_ROWS = 1024

# Policy-loss kernels: one program per sequence walks its row in BLOCK_T pieces, BLOCK_T the next power of
# two of T, between these bounds. 8 warps keep the forward's ten [BLOCK_T] accumulators at 4 registers
# each per thread (no spills at 1024).
POLICY_MAX_BLOCK_T = 1024
POLICY_MIN_BLOCK_T = 16
POLICY_NUM_WARPS = 8


def _cfg(block_n, block_v, block_d, num_warps, num_stages, **extra):
    kwargs = {"BLOCK_N": block_n, "BLOCK_V": block_v, "BLOCK_D": block_d, **extra}
    return triton.Config(kwargs, num_warps=num_warps, num_stages=num_stages)


# 128x128 logit tiles: tensor-core sized, and the fp32 tile is 64 registers per thread at 8 warps,
# which leaves room for the softmax epilogue. sm_80's mma.sync keeps its operands in registers, so
# its forward takes a 32-wide K step. Larger tiles (128x256, 256x128) spill; the compile test holds
# every config below to zero spills on its target (also checked by hand with triton 3.3 and 3.6).
#
# Two variants have their own configs. `_sampled`: the ∂z kernel with a kept-set threshold, soft-cap or per-row
# scale sits at the 255-register edge with 128x128 tiles (a few bytes of spills, depending on the flags), so it
# takes 64x128 (about 160 registers). `_f32head`: a bf16/fp16 hidden with a float32 head takes an IEEE float32
# dot, which has no tensor-core path (FMA dots): 64x128 / 128x64 tiles with an 8-wide K step stay spill-free
# with every flag (16-wide K steps or 64x64 tiles spill a few bytes in some combination).
DEFAULT_CONFIGS = {
    "logprob_fwd": {80: _cfg(128, 128, 32, 8, 4), 90: _cfg(128, 128, 64, 8, 4)},
    "logprob_dz": {80: _cfg(128, 128, 64, 8, 3, GROUP_N=16), 90: _cfg(128, 128, 64, 8, 4, GROUP_N=16)},
    "logprob_dz_sampled": {80: _cfg(64, 128, 64, 8, 3, GROUP_N=16), 90: _cfg(64, 128, 64, 8, 4, GROUP_N=16)},
    "logprob_fwd_f32head": {80: _cfg(64, 128, 8, 8, 3), 90: _cfg(64, 128, 8, 8, 3)},
    "logprob_dz_f32head": {80: _cfg(128, 64, 8, 8, 3, GROUP_N=16), 90: _cfg(128, 64, 8, 8, 3, GROUP_N=16)},
}

# Candidates per kernel and target for FASTRL_AUTOTUNE=1, each including that target's default.
AUTOTUNE_CONFIGS = {
    "logprob_fwd": {
        80: [_cfg(128, 128, 32, 8, 4), _cfg(128, 128, 32, 8, 5), _cfg(64, 256, 32, 8, 4), _cfg(64, 128, 32, 4, 4)],
        90: [_cfg(128, 128, 64, 8, 4), _cfg(128, 128, 64, 8, 3), _cfg(128, 128, 32, 8, 5)],
    },
    "logprob_dz": {
        80: [
            _cfg(128, 128, 64, 8, 3, GROUP_N=16),
            _cfg(128, 128, 32, 8, 4, GROUP_N=16),
            _cfg(128, 128, 128, 8, 3, GROUP_N=16),
            _cfg(64, 256, 64, 8, 3, GROUP_N=16),
        ],
        90: [
            _cfg(128, 128, 64, 8, 4, GROUP_N=16),
            _cfg(128, 128, 64, 8, 3, GROUP_N=16),
            _cfg(128, 128, 128, 8, 3, GROUP_N=16),
            _cfg(64, 256, 64, 8, 3, GROUP_N=16),
        ],
    },
}


for _name in ("logprob_dz_sampled", "logprob_fwd_f32head", "logprob_dz_f32head"):
    AUTOTUNE_CONFIGS[_name] = {arch: [cfg] for arch, cfg in DEFAULT_CONFIGS[_name].items()}


def logprob_kernel(base: str, sampled: bool, f32head: bool) -> str:
    """The config name of a log-prob launch: `base` ("logprob_fwd" / "logprob_dz"), or its `_f32head` /
    `_sampled` variant (the forward's own config holds with the sampled flags)."""
    if f32head:
        return base + "_f32head"
    return base + "_sampled" if sampled and base == "logprob_dz" else base


def shipped_configs(kernel: str, arch: int) -> list[triton.Config]:
    """The default and the autotune candidates for `arch`, without repeats: what the compile test builds."""
    out = []
    for cfg in [DEFAULT_CONFIGS[kernel][arch], *AUTOTUNE_CONFIGS[kernel][arch]]:
        if all(config_key(cfg) != config_key(c) for c in out):
            out.append(cfg)
    return out


def config_key(cfg: triton.Config) -> tuple:
    return (tuple(sorted(cfg.kwargs.items())), cfg.num_warps, cfg.num_stages)


# Autotune keys: the token count's bucket and the sizes that change the best tile.
AUTOTUNE_KEYS = {"logprob_fwd": ["n_bucket", "V", "D"], "logprob_dz": ["n_bucket", "n_cols", "D"]}
AUTOTUNE_KEYS.update(
    logprob_dz_sampled=AUTOTUNE_KEYS["logprob_dz"],
    logprob_fwd_f32head=AUTOTUNE_KEYS["logprob_fwd"],
    logprob_dz_f32head=AUTOTUNE_KEYS["logprob_dz"],
)


def autotune_enabled(device: torch.device) -> bool:
    """FASTRL_AUTOTUNE=1 on a GPU (the interpreter has no benchmarker: it keeps the defaults)."""
    return os.environ.get("FASTRL_AUTOTUNE", "0") == "1" and device.type == "cuda"


def arch_of(device: torch.device) -> int:
    """80 or 90: the generation whose default config fits `device` (the CPU interpreter gets 90's)."""
    if device.type != "cuda":
        return 90
    major, _ = torch.cuda.get_device_capability(device)
    return 90 if major >= 9 else 80


def default_config(kernel: str, device: torch.device) -> triton.Config:
    return DEFAULT_CONFIGS[kernel][arch_of(device)]


def token_bucket(n: int) -> int:
    """The autotune key for a token count: the next power of two (at least 256)."""
    return max(256, triton.next_power_of_2(max(n, 1)))


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


_TUNED = {}


def kernel_and_kwargs(kernel: str, jit_fn, device: torch.device, tune: bool = True):
    """The kernel to launch and its config kwargs: the default, or an autotuner (then no kwargs) when
    FASTRL_AUTOTUNE asks for one and `tune` allows it (a batch-invariant call never tunes: its config would
    follow the token count)."""
    arch = arch_of(device)
    if tune and autotune_enabled(device):
        if (kernel, arch) not in _TUNED:
            tuner = triton.autotune(configs=AUTOTUNE_CONFIGS[kernel][arch], key=AUTOTUNE_KEYS[kernel])
            _TUNED[(kernel, arch)] = tuner(jit_fn)
        return _TUNED[(kernel, arch)], {}
    cfg = DEFAULT_CONFIGS[kernel][arch]
    return jit_fn, {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


def poison_outputs() -> bool:
    """FASTRL_POISON=1 fills kernel outputs with NaN before launch: a debugging aid (an element a kernel never
    writes then shows as NaN instead of stale memory)."""
    return os.environ.get("FASTRL_POISON", "0") == "1"


def alloc(shape, dtype, device) -> torch.Tensor:
    if poison_outputs():
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


# The gradient-in-forward loss's Triton epilogue (fused_loss/epilogue.py): one program per row folds a
# `[C, V]` float32 tile in BLOCK_V strips; the ∂z kernel runs one program per `[1, BLOCK_V]` block.
FUSED_STATS_BLOCK_V = 2048
FUSED_STATS_NUM_WARPS = 8
FUSED_DZ_BLOCK_V = 2048
FUSED_DZ_NUM_WARPS = 8


# The replay kernels (logprobs/replay_fwd.py, replay_bwd.py) gather rows of W (or of hidden) by token id and
# reduce them with row-wise dots: no tensor cores, one fixed config per target and no autotuning ever, so a
# row's reduction order never depends on the call (batch invariance). A [BLOCK_K, BLOCK_D] float32 tile is
# 32 registers per thread at 4 warps.
REPLAY_CONFIGS = {
    "replay_fwd": {80: triton.Config({"BLOCK_K": 32, "BLOCK_D": 128}, num_warps=4, num_stages=2)},
    "replay_dh": {80: triton.Config({"BLOCK_K": 32, "BLOCK_D": 128}, num_warps=4, num_stages=2)},
    "replay_dw": {80: triton.Config({"BLOCK_K": 32, "BLOCK_D": 128}, num_warps=4, num_stages=2)},
}
for _cfgs in REPLAY_CONFIGS.values():
    _cfgs[90] = _cfgs[80]


def replay_config(kernel: str, device: torch.device) -> dict:
    """The launch kwargs of a replay kernel on `device`: its one config (never autotuned)."""
    cfg = REPLAY_CONFIGS[kernel][arch_of(device)]
    return {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
