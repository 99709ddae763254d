"""Per-token log-probabilities and entropy from hidden states and the LM-head weight (docs/math.md §1).

params.py    LogprobParams and MIN_TEMPERATURE, the frozen scalars every implementation takes
checks.py    the input checks (one temperature rule, `check_temperature`)
naive.py     eager full-logits reference, O(N·V) memory: the test oracle and benchmark baseline
chunked.py   chunked PyTorch forward/backward, O(N + V) extra memory on any device, and its autograd Function
vocab_major.py  the `[V, C]` target-shifted tile of the float32 CPU walks
tile.py      the logit-tile K-loop both Triton kernels share (the torch tile is ../logits.py)
fwd.py       Triton forward kernel + launcher
bwd.py       Triton ∂L/∂z kernel + launcher (the gradient GEMMs run in cuBLAS)
function.py  the Triton path's autograd Function
api.py       `token_logprobs` / `sampled_token_logprobs`, `LogprobRequest`, `logprob_call` and `route`, the one router
sampling.py  the sampler's kept set (min-p, top-k, top-p) as one threshold per row, and `sampler_on`
sampled.py   the truncated / soft-capped forward and backward (docs/math.md §8)
kernel_logits.py  the Triton forward's own final logits of a block of rows (the Triton path's θ search)
invariant.py the torch walks on blocks of a fixed row count: batch invariance (docs/math.md §1.2)
vocab_parallel.py  the head split by rows over a process group (docs/math.md §6)
kept_set.py  the sampler's kept sets in CSR form: their contract, and `kept_set_from_vllm` (docs/math.md §9)
replay.py    the replay path: log-probs over given kept sets, its autograd Function (docs/math.md §9)
replay_torch.py  its PyTorch walk; replay_fwd.py / replay_bwd.py its Triton kernels; replay_naive.py its reference
"""

from .api import LogprobRequest, logprob_call, logprob_path, sampled_token_logprobs, shape_logprobs, token_logprobs
from .checks import check_temperature
from .kept_set import keep_rows, kept_set_from_vllm
from .naive import sampled_logprobs_reference, token_logprobs_reference
from .params import MIN_TEMPERATURE, LogprobParams
from .replay_naive import replay_logprobs_reference
from .sampling import sampler_on

__all__ = [
    "MIN_TEMPERATURE",
    "LogprobParams",
    "LogprobRequest",
    "check_temperature",
    "keep_rows",
    "kept_set_from_vllm",
    "logprob_call",
    "logprob_path",
    "replay_logprobs_reference",
    "sampled_logprobs_reference",
    "sampled_token_logprobs",
    "sampler_on",
    "shape_logprobs",
    "token_logprobs",
    "token_logprobs_reference",
]
