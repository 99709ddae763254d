"""A training step's extra memory is set by the token budget, not by the vocabulary: 8k-token sequences, V = 32k.

One `[tokens, V]` float32 tensor of such a micro-batch is 8192 * 32000 * 4 B = 1000 MiB (an eager trainer holds
several: logits, log-softmax, their gradients; `_memory_child.py eager` measures ~4 GiB here). The fused step must
stay under half of ONE such tensor. Measured as ru_maxrss growth in a fresh process (torch's CPU allocations are
invisible to tracemalloc).
"""

import json
import os
import subprocess
import sys

import pytest

TOKENS, VOCAB, N_SEQ = 8192, 32000, 2
LOGITS_MIB = TOKENS * VOCAB * 4 / 2**20


@pytest.mark.slow
def test_fused_step_on_8k_tokens_stays_under_half_a_logits_tensor():
    child = os.path.join(os.path.dirname(__file__), "_memory_child.py")
    proc = subprocess.run(
        [sys.executable, child, "fused", str(TOKENS), str(VOCAB), str(N_SEQ)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    extra = json.loads(proc.stdout.strip().splitlines()[-1])["extra_mib"]
    assert extra < 0.5 * LOGITS_MIB, f"step used {extra:.0f} MiB extra; one [tokens, V] fp32 tensor is {LOGITS_MIB:.0f}"
