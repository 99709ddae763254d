"""The GRPO/PPO loss with its gradient formed in the forward pass (docs/math.md §7).

params.py    FusedLossParams
chunked.py   the walk over token chunks: logit GEMM, fold, ∂z, d_hidden / d_weight GEMMs
epilogue.py  the fold and ∂z as Triton kernels (the GPU path; the GEMMs stay cuBLAS)
tokens.py    per-token loss derivatives from the policy op (`policy_rows`)
function.py  the autograd Function whose backward scales the stored gradients
api.py       `fused_logprob_grads`: input checks and the entry point
"""

from .api import fused_logprob_grads, policy_loss_grads
from .chunked import fused_forward, fused_rows
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
    "policy_loss_grads",
    "take_weight_gradient",
]
