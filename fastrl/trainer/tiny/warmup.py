"""The tiny task's supervised warm-up: noisy demonstrations of the addition task, then plain SFT steps.

Warming up on demonstrations that are right only some of the time leaves the model with a partial skill
(it knows the format and puts some probability on the right sum), which GRPO then sharpens from rewards.
"""

import random

import torch

from fastrl.kernels import token_logprobs

from ..batching import Sample, collate
from ..rollout import build_prompt
from ..tasks import Problem
from ..update import completion_hidden, head_params


def arithmetic_completion(prompt: str, answer: str) -> str:
    """The tiny task's completion: a reasoning block restating the sum, then the boxed answer.

    It satisfies `format_reward` (non-empty `<think>` block, then `\\boxed{}`) in 8-9 tokens.
    """
    return f"<think>{prompt.rstrip('=')}</think>\\boxed{{{answer}}}"


def noisy_demonstration(problem: Problem, rng: random.Random, noise: float) -> str:
    """A warm-up target that is right with probability 1 - noise, else a plausible slip (off by 1 or 10).

    Warming up on these leaves the model with a *partial* skill: it knows the format and puts some of its
    probability on the right sum, but samples a near miss most of the time. Only the reward tells the
    samples apart, which is what GRPO has to learn from.
    """
    answer = int(problem.answer)
    if rng.random() < noise:
        answer = max(0, answer + rng.choice((-10, -1, 1, 10)))
    return arithmetic_completion(problem.prompt, str(answer))


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
