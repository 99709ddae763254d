"""Per-token log-probabilities and entropy from hidden states and the LM-head weight (docs/math.md §1).

params.py    LogprobParams, the frozen scalars every implementation takes
naive.py     eager full-logits reference, O(N·V) memory: the test oracle and benchmark baseline
chunked.py   chunked PyTorch forward/backward, O(N + V) extra memory on any device
tile.py      the logit-tile K-loop both Triton kernels share
fwd.py       Triton forward kernel + launcher
bwd.py       Triton ∂L/∂z kernel + launcher (the gradient GEMMs run in cuBLAS)
function.py  the autograd Functions of the chunked and Triton paths
api.py       `token_logprobs`: input checks and the public entry point
sampling.py  the sampler's kept set (min-p, top-k, top-p) as one threshold per row, found on a logit tile
sampled.py   the truncated / soft-capped forward and backward (docs/math.md §8)
vocab_parallel.py  the head split by rows over a process group (docs/math.md §6)
"""

from .api import sampled_token_logprobs, token_logprobs
from .naive import sampled_logprobs_reference, token_logprobs_reference
from .params import LogprobParams

__all__ = [
    "LogprobParams",
    "sampled_logprobs_reference",
    "sampled_token_logprobs",
    "token_logprobs",
    "token_logprobs_reference",
]
