"""The run's AdamW: torch's fused kernel, no parameter-sized temporaries, the same step as the per-parameter loop."""

import torch

from fastrl.trainer.build import make_adamw, start_run
from fastrl.trainer.config import make_config


def _params():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4096, 64)), torch.nn.Parameter(torch.randn(64))]
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def test_fused_step_equals_the_loop_without_parameter_sized_temporaries():
    fused_params, loop_params = _params(), _params()
    fused = make_adamw(fused_params, 1e-2, 0.1, (0.9, 0.99))
    loop = torch.optim.AdamW(loop_params, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99), foreach=False)
    assert fused.defaults["fused"] is True
    for opt in (fused, loop):  # the moments come up on the first step
        opt.step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fused.step()
    allocated = sum(max(e.cpu_memory_usage, 0) for e in prof.events())
    assert allocated < fused_params[0].numel() * 4, allocated  # the loop's step allocates 2 x 1 MiB here
    loop.step()
    for a, b in zip(fused_params, loop_params):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_the_run_builds_the_fused_optimizer(tmp_path):
    config = make_config("tiny", output_dir=str(tmp_path), warmup_sft_steps=0, max_steps=1, progress=False)
    assert start_run(config).optimizer.defaults["fused"] is True


def test_parameters_without_a_fused_kernel_get_the_loop():
    assert make_adamw([torch.nn.Parameter(torch.zeros(2, device="meta"))], 1e-3).defaults["fused"] is None
