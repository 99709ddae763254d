"""The supervised warm-up (`warmup_sft_steps`): plain SFT steps on the tiny tasks' noisy demonstrations.

It gives GRPO a partial skill to sharpen (`tiny/warmup.py` says why the demonstrations are noisy). The products
task's demonstrations call the python tool in the code format; their observations are built as a rollout inserts
them (tokenized alone) and, as in GRPO's loss, take no part in the warm-up's.
"""

import random

import torch

from fastrl.kernels import token_logprobs

from .batching import Sample, collate
from .rollout import build_prompt
from .tasks import PRODUCTS, demonstrated
from .tiny.warmup import noisy_demonstration, tool_demonstration
from .update import completion_hidden, head_params


def sft_warmup(model, tokenizer, problems, config, packed: bool, progress: bool = False) -> float:
    """Supervised warm-up on noisy demonstrations (the built-in tasks only). Returns the last loss."""
    if not demonstrated(config.dataset):
        raise ValueError(f"warmup_sft_steps > 0 needs a built-in task (arithmetic, products), got {config.dataset!r}")
    if config.dataset.startswith(PRODUCTS) and (config.tool_format != "code" or "python" not in config.tools):
        raise ValueError(f"the warm-up of {config.dataset!r} demonstrates the python tool in the code format: set "
                         f"--tools python --tool-format code (got tools={config.tools!r}, "
                         f"tool_format={config.tool_format!r})")  # fmt: skip
    rng = random.Random(config.seed + 17)
    opt = torch.optim.AdamW(model.parameters(), lr=config.warmup_sft_lr, betas=(0.9, 0.98), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
    loss = torch.zeros(())
    model.train()
    from tqdm import tqdm

    for _ in tqdm(range(config.warmup_sft_steps), desc="sft warm-up", disable=not progress, dynamic_ncols=True):
        batch = [rng.choice(problems) for _ in range(config.warmup_sft_batch_size)]
        samples = [
            _sample(tokenizer, build_prompt(tokenizer, p.prompt, config.prompt_template, config.chat_template,
                                            config.max_prompt_length), _demonstration(p, config, rng))
            for p in batch
        ]  # fmt: skip
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


def _demonstration(problem, config, rng: random.Random) -> list[tuple[str, bool]]:
    """The warm-up target of `problem` as (text, sampled) pieces."""
    if config.dataset.startswith(PRODUCTS):
        return tool_demonstration(problem, rng, config.warmup_sft_noise)
    return [(noisy_demonstration(problem, rng, config.warmup_sft_noise), True)]


def _sample(tokenizer, prompt_ids: list[int], pieces: list[tuple[str, bool]]) -> Sample:
    """A warm-up sample: each piece tokenized alone, then the end token; pieces not sampled are masked out."""
    ids, mask = [], []
    for text, sampled in pieces:
        piece = tokenizer.encode(text)
        ids += piece
        mask += [float(sampled)] * len(piece)
    masked = not all(sampled for _, sampled in pieces)
    return Sample(prompt_ids, ids + [tokenizer.eos_token_id], 0.0, token_mask=mask + [1.0] if masked else None)
