import pytest
import torch

from bench.bench_grpo_loss import OP
from bench.pytest_bench import case_id, check_then_benchmark

CUDA = torch.cuda.is_available()
SHAPE, DTYPE = (dict(B=8, T=1024, D=4096, V=151936), "bf16") if CUDA else (dict(B=2, T=512, D=128, V=32768), "fp32")


IDS = [case_id(p, "fwd+bwd", SHAPE, DTYPE) for p in OP.providers]


@pytest.mark.parametrize("provider", list(OP.providers), ids=IDS)
def test_grpo_loss(benchmark, provider, device, shape_cache):
    benchmark.group = f"grpo_loss fwd+bwd {case_id('', '', SHAPE, DTYPE).strip('-')}"
    check_then_benchmark(benchmark, OP, provider, "fwd+bwd", SHAPE, DTYPE, device, shape_cache)
