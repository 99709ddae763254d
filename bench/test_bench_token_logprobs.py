import pytest
import torch

from bench.bench_token_logprobs import OP
from bench.pytest_bench import case_id, check_then_benchmark

CUDA = torch.cuda.is_available()
SHAPE, DTYPE = (dict(N=8192, D=4096, V=151936), "bf16") if CUDA else (dict(N=1024, D=128, V=32768), "fp32")
CASES = [(p, m) for p in OP.providers for m in ("fwd", "bwd", "fwd+bwd")]


@pytest.mark.parametrize("provider,mode", CASES, ids=[case_id(p, m, SHAPE, DTYPE) for p, m in CASES])
def test_token_logprobs(benchmark, provider, mode, device, shape_cache):
    benchmark.group = f"token_logprobs {mode} {case_id('', '', SHAPE, DTYPE).strip('-')}"
    check_then_benchmark(benchmark, OP, provider, mode, SHAPE, DTYPE, device, shape_cache)
