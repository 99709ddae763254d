"""The GRPO/PPO loss with its gradient formed in the forward pass (docs/math.md §7).

api.py       `fused_logprob_grads` on the log-prob op's checked call, and the walks it runs over token chunks
             (logit GEMM, fold, ∂z, d_hidden / d_weight GEMMs; the float32 CPU walk on vocab-major tiles)
epilogue.py  the fold and ∂z as Triton kernels (the GPU path; the GEMMs stay cuBLAS)
tokens.py    per-token loss derivatives from the policy op (`PolicyTokens`)
function.py  the autograd Function whose backward scales the stored gradients
params.py    FusedLossParams
"""

from .api import fused_forward, fused_logprob_grads, fused_rows
from .function import attach_gradients, take_weight_gradient
from .params import FusedLossParams
from .tokens import PolicyTokens

__all__ = [
    "FusedLossParams",
    "PolicyTokens",
    "attach_gradients",
    "fused_forward",
    "fused_logprob_grads",
    "fused_rows",
    "take_weight_gradient",
]
