"""The per-token PPO/GRPO policy loss, reduced to per-sequence sums (docs/math.md §2).

params.py    PolicyLossParams, the STATS column layout and its STAT_* kernel indices
naive.py     pure-PyTorch path: the reference and the CPU implementation
terms.py     the token-level Triton code both kernels share, and their launch arguments
fwd.py       Triton forward kernel + launcher
bwd.py       Triton backward kernel + launcher
function.py  the autograd Function of the Triton path
api.py       `policy_rows`: the public entry point
"""

from .api import policy_rows
from .naive import policy_rows_torch
from .params import NUM_STATS, STATS, PolicyLossParams

__all__ = ["NUM_STATS", "STATS", "PolicyLossParams", "policy_rows", "policy_rows_torch"]
