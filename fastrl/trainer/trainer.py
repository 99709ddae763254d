"""GRPO trainer: the loop that ties rollouts, rewards, advantages and the fused-loss update together.

Algorithm (DeepSeekMath / R1 GRPO), per rollout batch:
  1. take `prompts_per_step` prompts (each rank its own shard) and sample G completions of each;
  2. score them (accuracy + format by default; optional length / overlong shaping);
  3. advantages A_i = (R_i - mean_group R) / (std_group R + 1e-4) (or batch std, or none);
  4. if the batch feeds several optimizer steps (ppo_epochs * minibatches > 1), record the sampling
     policy's log-probs once; with beta > 0, the frozen reference model's log-probs;
  5. per optimizer step: token-budget micro-batches, the fused clipped-surrogate loss with the GLOBAL
     normalizer, gradients summed over ranks, clipping, AdamW, LR schedule;
  6. push the new weights to the rollout engine (vLLM), log, checkpoint.

Run it:  fastrl train --preset tiny --output-dir runs/tiny          (CPU, a few minutes)
         torchrun --nproc-per-node 8 -m fastrl.trainer train --preset math-32k --model <hf id>
"""

import copy
import math
import os
import random
import time
import warnings

import torch

from fastrl.kernels import token_logprobs
from fastrl.losses import LossConfig

from . import distributed as dist_utils
from .advantages import group_advantages, zero_std_groups
from .batching import Sample, collate
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .config import TrainConfig, config_to_dict
from .metrics import MetricsLogger
from .rewards import (
    accuracy_reward,
    batch_accuracy_reward,
    combine_rewards,
    format_reward,
    length_penalty,
    overlong_penalty,
)
from .rollout import build_prompt, make_engine
from .tasks import PromptStream, load_problems, noisy_demonstration
from .tiny import CharTokenizer, tiny_model
from .update import completion_hidden, head_params, sequence_logprobs, supports_packing, train_step

REWARD_FNS = {"accuracy": accuracy_reward, "format": format_reward}


def build_model(config: TrainConfig, device: torch.device):
    """(model, tokenizer): the built-in tiny pair, or a Hugging Face causal LM and its tokenizer."""
    if config.model == "tiny":
        tokenizer = CharTokenizer()
        max_len = config.max_prompt_length + config.max_completion_length
        model = tiny_model(
            len(tokenizer), config.tiny_hidden_size, config.tiny_layers, max_len=min(max_len, 4096), seed=config.seed
        )
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(config.model)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        attn = "sdpa"
        if device.type == "cuda":
            try:
                import flash_attn  # noqa: F401

                attn = "flash_attention_2"  # varlen kernels: padding-free packing
            except ImportError:
                pass
        model = AutoModelForCausalLM.from_pretrained(config.model, dtype=torch.float32, attn_implementation=attn)
    model.to(device)
    if config.gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name; the old one warns
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model, tokenizer


def build_reward(config: TrainConfig):
    terms = []
    for spec in config.rewards:
        name, _, weight = spec.partition(":")
        if name not in REWARD_FNS:
            raise ValueError(f"unknown reward {name!r} in {spec!r}; known: {sorted(REWARD_FNS)}")
        terms.append((name, REWARD_FNS[name], float(weight or 1.0)))
    return combine_rewards(terms)


def loss_config(config: TrainConfig) -> LossConfig:
    return LossConfig(
        loss_agg=config.loss_agg,
        eps_low=config.eps_low,
        eps_high=config.eps_high,
        dual_clip=config.dual_clip,
        beta=config.beta,
        kl=config.kl,
        entropy_coef=config.entropy_coef,
        temperature=config.temperature,
        ratio_level=config.ratio_level,
        is_cap=config.is_cap,
        max_completion_length=config.max_completion_length,
    )


def make_scheduler(optimizer, config: TrainConfig):
    warm, total = config.lr_warmup_steps, config.max_steps

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        frac = (step - warm) / max(1, total - warm)
        if config.lr_schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        if config.lr_schedule == "linear":
            return max(0.0, 1 - frac)
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def sft_warmup(model, tokenizer, problems, config: TrainConfig, packed: bool, progress: bool = False) -> float:
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


def shaped_rewards(scores, correct: list[float], lengths: list[int], config: TrainConfig) -> torch.Tensor:
    """The combined reward plus the optional length (Kimi k1.5, per group) and overlong (DAPO) terms."""
    G = config.group_size
    total = torch.tensor(scores.total, dtype=torch.float64)
    if config.length_penalty:
        for start in range(0, len(lengths), G):
            sl = slice(start, start + G)
            pen = length_penalty(lengths[sl], [c > 0.5 for c in correct[sl]])
            total[sl] += config.length_penalty * torch.tensor(pen, dtype=torch.float64)
    if config.overlong_buffer:
        pen = [overlong_penalty(n, config.max_completion_length, config.overlong_buffer) for n in lengths]
        total += torch.tensor(pen, dtype=torch.float64)
    return total


def collect(engine, tokenizer, problems, config: TrainConfig, reward) -> tuple[list[Sample], dict]:
    """Sample G completions per problem, score them, compute advantages; samples + rollout metrics."""
    G = config.group_size
    prompts = [
        build_prompt(tokenizer, p.prompt, config.prompt_template, config.chat_template, config.max_prompt_length)
        for p in problems
    ]
    comps = engine.generate(prompts, G, want_logprobs=config.is_cap is not None)
    texts = [tokenizer.decode(c.completion_ids, skip_special_tokens=True) for c in comps]
    golds = [p.answer for p in problems for _ in range(G)]
    scores = reward.score(texts, golds)
    correct = scores.per_fn["accuracy"] if "accuracy" in scores.per_fn else batch_accuracy_reward(texts, golds)
    lengths = [len(c.completion_ids) for c in comps]
    total = shaped_rewards(scores, correct, lengths, config)
    batch_std = None
    if config.advantage_scale == "batch-std":  # the std over all ranks' rewards
        n, s, s2 = dist_utils.all_reduce_sum_list([total.numel(), float(total.sum()), float((total**2).sum())])
        batch_std = math.sqrt(max(s2 - s * s / n, 0.0) / max(n - 1, 1))
    adv = group_advantages(total, G, config.advantage_scale, batch_std=batch_std).tolist()
    flat = zero_std_groups(total, G)
    drop = flat.repeat_interleave(G).tolist() if config.filter_zero_std else [False] * len(comps)
    samples = [
        Sample(
            c.prompt_ids, c.completion_ids, a, not (config.mask_truncated and c.truncated), rollout_logprobs=c.logprobs
        )
        for c, a, d in zip(comps, adv, drop)
        if not d
    ]
    # global sums over ranks, then means
    local = {
        "n": len(comps), "reward": float(total.sum()), "reward_sq": float((total**2).sum()),
        "correct": sum(correct), "flat_groups": float(flat.sum()), "groups": len(problems),
        "length": sum(lengths), "truncated": sum(c.truncated for c in comps),
        "prompt_tokens": sum(len(p) for p in prompts) * G,
        **{f"reward_{k}_mean": sum(v) for k, v in scores.per_fn.items()},
    }  # fmt: skip
    g = dict(zip(local, dist_utils.all_reduce_sum_list([float(v) for v in local.values()])))
    n = g["n"]
    metrics = {
        "reward_mean": g["reward"] / n,
        "reward_std": math.sqrt(max(g["reward_sq"] / n - (g["reward"] / n) ** 2, 0.0)),
        "reward_correct_mean": g["correct"] / n,
        "frac_zero_std_groups": g["flat_groups"] / g["groups"],
        "response_length_mean": g["length"] / n,
        "response_length_max": dist_utils.all_reduce_max(float(max(lengths, default=0))),
        "truncation_rate": g["truncated"] / n,
        "rollout_tokens": g["length"] + g["prompt_tokens"],
        **{k: v / n for k, v in g.items() if k.startswith("reward_") and k.endswith("_mean")},
    }
    return samples, metrics


def attach_logprobs(model, samples: list[Sample], field: str, config: TrainConfig, packed: bool, pad_id: int):
    """Set `field` of each sample to its completion's log-probs under `model` (no grad, fused path)."""
    logprobs = sequence_logprobs(
        model, samples, config.max_tokens_per_microbatch, packed, pad_id, config.temperature, config.impl, config.bf16
    )
    for s, lp in zip(samples, logprobs):
        setattr(s, field, lp)


def step_record(step: int, rollout: dict, update: dict, lr: float, rollout_s: float, step_s: float) -> dict:
    """One metrics.jsonl line: the rollout batch's metrics and this optimizer step's."""
    return {
        "step": step,
        **rollout,
        "loss": update["loss"],
        "kl": update["kl_mean"],
        "clip_frac_low": update["clip_frac_low"],
        "clip_frac_high": update["clip_frac_high"],
        "ratio_mean": update["ratio_mean"],
        "entropy": update["entropy_mean"],
        "grad_norm": update["grad_norm"],
        "update_skipped": update["update_skipped"],
        "lr": lr,
        "train_tokens": update["num_tokens"],
        "rollout_s": rollout_s,
        "step_s": step_s,
        "tokens_per_s": rollout["rollout_tokens"] / max(step_s, 1e-9),
    }


def should_save(step: int, config: TrainConfig) -> bool:
    """Save at the end, and at the first rollout boundary at or after each multiple of save_steps.

    Checkpoints fall on rollout boundaries so a resumed run never re-does half a rollout batch.
    """
    per_rollout = config.ppo_epochs * config.minibatches
    periodic = config.save_steps > 0 and step >= config.save_steps and step % config.save_steps < per_rollout
    return periodic or step >= config.max_steps


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device(name)


def train(config: TrainConfig) -> dict:
    """Run GRPO as configured; returns the last step's metrics. Resumable from `config.output_dir`."""
    t_start = time.time()
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    device = resolve_device(config.device)
    own_group = dist_utils.init_from_env(device.type)
    rank, world = dist_utils.rank(), dist_utils.world_size()
    if (config.prompts_per_step // world) % config.minibatches or config.prompts_per_step % world:
        raise ValueError(
            f"prompts_per_step={config.prompts_per_step} must split evenly over {world} ranks and then "
            f"into minibatches={config.minibatches}"
        )
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    model, tokenizer = build_model(config, device)
    packed = config.packing == "on" or (config.packing == "auto" and supports_packing(model))
    problems = load_problems(
        config.dataset,
        config.seed,
        split=config.dataset_split,
        prompt_key=config.prompt_key,
        answer_key=config.answer_key,
    )
    resume_from = latest_checkpoint(config.output_dir) if config.resume else None
    if config.warmup_sft_steps and resume_from is None:
        sft_warmup(model, tokenizer, problems, config, packed, progress=config.progress and rank == 0)
    ref_model = None
    if config.beta > 0:  # the policy as GRPO starts (after any warm-up); frozen
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, config.adam_beta2)
    )
    scheduler = make_scheduler(optimizer, config)
    stream = PromptStream(problems, config.seed)
    step, elapsed_before = 0, 0.0
    if resume_from is not None:
        state = load_checkpoint(resume_from, model, optimizer, scheduler)
        step, stream.position, elapsed_before = state["step"], state["data_position"], state.get("elapsed_s", 0.0)
        if ref_model is not None and "ref_model" in state:
            ref_model.load_state_dict(state["ref_model"])
    else:
        torch.manual_seed(config.seed * 7919 + rank)  # ranks sample differently
    logger = MetricsLogger(config.output_dir, step if resume_from else None, config.tensorboard, enabled=rank == 0)
    engine = make_engine(config.engine, model, tokenizer, config)
    reward = build_reward(config)
    lcfg = loss_config(config)
    bar = None
    if config.progress and rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=config.max_steps, initial=step, desc="grpo", dynamic_ncols=True)
    t_run = time.time()
    record: dict = {}
    while step < config.max_steps:
        t0 = time.time()
        batch = dist_utils.shard(stream.next_batch(config.prompts_per_step))
        samples, rollout_metrics = collect(engine, tokenizer, batch, config, reward)
        if config.needs_old_logprobs:  # the batch feeds several steps: freeze the sampler's log-probs
            attach_logprobs(model, samples, "old_logprobs", config, packed, tokenizer.pad_token_id)
        if ref_model is not None:
            attach_logprobs(ref_model, samples, "ref_logprobs", config, packed, tokenizer.pad_token_id)
        t_rollout = time.time() - t0
        for _ in range(config.ppo_epochs):
            order = list(range(len(samples)))
            if config.ppo_epochs > 1:
                random.shuffle(order)
            chunks = [order[i :: config.minibatches] for i in range(config.minibatches)]
            for chunk in chunks:
                if step >= config.max_steps:
                    break
                model.train()
                metrics = train_step(
                    model,
                    optimizer,
                    [samples[i] for i in chunk],
                    lcfg,
                    budget=config.max_tokens_per_microbatch,
                    packed=packed,
                    pad_id=tokenizer.pad_token_id,
                    max_grad_norm=config.max_grad_norm,
                    impl=config.impl,
                    bf16=config.bf16,
                    log_entropy=config.log_entropy,
                )
                lr = scheduler.get_last_lr()[0]
                with warnings.catch_warnings():  # a step with nothing to train skips optimizer.step()
                    warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step()`")
                    scheduler.step()
                step += 1
                record = step_record(step, rollout_metrics, metrics, lr, t_rollout, time.time() - t0)
                record["elapsed_s"] = elapsed_before + time.time() - t_run
                logger.log(record)
                if bar is not None:
                    bar.set_postfix(
                        reward=f"{record['reward_correct_mean']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}"
                    )
                    bar.update(1)
        engine.sync_weights(model)
        if should_save(step, config):
            extra = {
                "data_position": stream.position,
                "elapsed_s": elapsed_before + time.time() - t_run,
                "config": config_to_dict(config),
            }
            if ref_model is not None:
                extra["ref_model"] = ref_model.state_dict()
            save_checkpoint(config.output_dir, step, model, optimizer, scheduler, extra, config.keep_checkpoints)
    if bar is not None:
        bar.close()
    logger.close()
    if own_group:
        dist_utils.cleanup()
    record["total_wall_s"] = time.time() - t_start
    return record
