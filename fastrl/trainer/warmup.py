"""The supervised warm-up (`warmup_sft_steps`): plain SFT steps on the tiny task's noisy demonstrations.

It gives GRPO a partial skill to sharpen (`tiny/warmup.py` says why the demonstrations are noisy).
"""

import random

import torch

from fastrl.kernels import token_logprobs

from .batching import Sample, collate
from .rollout import build_prompt
from .tiny.warmup import noisy_demonstration
from .update import completion_hidden, head_params


def sft_warmup(model, tokenizer, problems, config, packed: bool, progress: bool = False) -> float:
    """Supervised warm-up on noisy demonstrations (arithmetic task only). Returns the last loss."""
    if not config.dataset.startswith("arithmetic"):
        raise ValueError(f"warmup_sft_steps > 0 needs the arithmetic dataset, got {config.dataset!r}")
    rng = random.Random(config.seed + 17)
    opt = torch.optim.AdamW(model.parameters(), lr=config.warmup_sft_lr, betas=(0.9, 0.98), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
    loss = torch.zeros(())
    model.train()
    from tqdm import tqdm

    for _ in tqdm(range(config.warmup_sft_steps), desc="sft warm-up", disable=not progress, dynamic_ncols=True):
        batch = [rng.choice(problems) for _ in range(config.warmup_sft_batch_size)]
        samples = [
            Sample(
                build_prompt(
                    tokenizer, p.prompt, config.prompt_template, config.chat_template, config.max_prompt_length
                ),
                tokenizer.encode(noisy_demonstration(p, rng, config.warmup_sft_noise)) + [tokenizer.eos_token_id],
                0.0,
            )
            for p in batch
        ]
        mb = collate(samples, packed, tokenizer.pad_token_id)
        hidden = completion_hidden(model, mb, config.bf16)
        weight, bias = head_params(model, hidden.dtype)
        logp = token_logprobs(hidden, weight, mb["targets"].to(hidden.device), bias=bias, impl=config.impl)
        mask = mb["mask"].to(hidden.device)
        loss = -(logp * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    opt.zero_grad(set_to_none=True)  # the GRPO step must not inherit the last warm-up gradient
    return float(loss.detach())
