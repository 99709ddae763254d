"""The providers of bench/long_cot_step.py, each run in a child interpreter: the shared model and batch, and one
GRPO step of fastrl's trainer, FastRLGRPOTrainer, stock TRL or eager full logits (the parent's docstring says
what each does and what is checked)."""

import statistics
import tempfile
import time

LR = 1e-6


def status_kib(pid, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def logp_path(grads_out: str) -> str:
    return grads_out + ".logp"


# ----------------------------------------------------------------------------- the shared model and batch


def save_model(opts, path: str) -> None:
    """Random Qwen2 weights with Qwen2.5-0.5B's head and width, and a tokenizer, saved to `path`."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=opts.vocab, hidden_size=opts.hidden, intermediate_size=opts.intermediate,
        num_hidden_layers=opts.layers, num_attention_heads=opts.heads, num_key_value_heads=opts.kv_heads,
        max_position_embeddings=max(32768, opts.prompt_length + opts.completion_length), rope_theta=1e6,
        rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=1,
    )  # fmt: skip
    Qwen2ForCausalLM(config).float().save_pretrained(path)
    tok = Tokenizer(models.WordLevel({"<pad>": 0, "<eos>": 1, "<unk>": 2}, unk_token="<unk>"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tokenizer.save_pretrained(path)


def batch(opts, length: int):
    """(prompt ids [P], completion ids [G, length], advantages [G]): fixed, the same in every provider."""
    import torch

    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, opts.vocab, (opts.prompt_length,), generator=g)
    completions = torch.randint(3, opts.vocab, (opts.group, length), generator=g)
    advantages = torch.linspace(1.0, -0.5, opts.group) if opts.group > 1 else torch.ones(1)
    return prompt, completions, advantages


def _load(opts):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(opts.model_dir, dtype=torch.float32, attn_implementation="sdpa")
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return model


# ----------------------------------------------------------------------------- one step per provider


def fastrl_step(opts):
    """(model, step): the trainer's own build and update code, with the math-32k preset's update settings."""
    import torch

    from fastrl.losses import LossConfig
    from fastrl.trainer.batching import Sample
    from fastrl.trainer.build import build_model, make_adamw
    from fastrl.trainer.config import make_config
    from fastrl.trainer.update import StepSettings, sequence_logprobs, supports_packing, train_step

    config = make_config(
        preset="math-32k", model=opts.model_dir, max_prompt_length=opts.prompt_length,
        max_completion_length=opts.completion_length, group_size=max(2, opts.group), prompts_per_step=1,
        max_tokens_per_microbatch=opts.budget, eps_high=0.2, lr=LR, device="cpu", bf16=False,
    )  # fmt: skip
    model, tokenizer = build_model(config, torch.device("cpu"))
    packed = config.packing == "on" or (config.packing == "auto" and supports_packing(model))
    optimizer = make_adamw(model.parameters(), config.lr, config.weight_decay, (0.9, config.adam_beta2))

    def samples(length):
        prompt, completions, advantages = batch(opts, length)
        return [Sample(prompt.tolist(), c.tolist(), float(a)) for c, a in zip(completions, advantages)]

    def score(length):  # the trainer's own scoring of the completion tokens
        loss = LossConfig(temperature=config.loss.temperature)
        budget = config.max_tokens_per_microbatch
        settings = StepSettings(loss, budget, packed, tokenizer.pad_token_id, impl=config.impl, bf16=False)
        logp = sequence_logprobs(model, samples(length), settings)
        return torch.tensor(logp)

    def step(length):
        model.train()
        settings = StepSettings.from_config(config, packed, tokenizer.pad_token_id)
        out = train_step(model, optimizer, samples(length), settings)
        return out["loss"]

    return model, optimizer, step, score


def trl_step(opts, fastrl: bool, workdir: str):
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from fastrl.integrations.trl import FastRLGRPOTrainer

    model = _load(opts)
    args = GRPOConfig(
        output_dir=workdir, use_cpu=True, bf16=False, per_device_train_batch_size=opts.group,
        num_generations=opts.group, max_completion_length=opts.completion_length, report_to="none",
        disable_tqdm=True, learning_rate=LR,
    )  # fmt: skip
    cls = FastRLGRPOTrainer if fastrl else GRPOTrainer
    trainer = cls(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                  train_dataset=Dataset.from_dict({"prompt": ["a"] * opts.group}),
                  processing_class=AutoTokenizer.from_pretrained(opts.model_dir))  # fmt: skip
    trainer.current_gradient_accumulation_steps = 1
    optimizer = trainer.create_optimizer()
    params = [p for p in trainer.model.parameters() if p.requires_grad]

    def score(length):  # the trainer's own per-token log-probs (FastRLGRPOTrainer: fastrl's fused head)
        prompt, completions, _ = batch(opts, length)
        ids = torch.cat([prompt.expand(opts.group, -1), completions], dim=1)
        with torch.no_grad():
            logp = trainer._get_per_token_logps_and_entropies(trainer.model, ids, torch.ones_like(ids), length)[0]
        return logp.float()

    def step(length):
        prompt, completions, advantages = batch(opts, length)
        mask = torch.ones_like(completions)
        inputs = {
            "prompt_ids": prompt.expand(opts.group, -1).clone(), "prompt_mask": torch.ones(opts.group,
            opts.prompt_length, dtype=torch.long), "completion_ids": completions, "completion_mask": mask,
            "advantages": advantages, "num_items_in_batch": mask.sum(),
        }  # fmt: skip
        trainer.model.train()
        optimizer.zero_grad(set_to_none=True)
        loss = trainer.compute_loss(trainer.model, inputs)
        trainer.accelerator.backward(loss)
        torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return trainer.model, optimizer, step, score


def eager_step(opts):
    import torch

    from fastrl.trainer.build import make_adamw

    model = _load(opts)
    optimizer = make_adamw(model.parameters(), LR)  # the trainer's (and TRL's default) fused AdamW
    params = [p for p in model.parameters() if p.requires_grad]

    def logprobs(length):
        prompt, completions, _ = batch(opts, length)
        input_ids = torch.cat([prompt.expand(opts.group, -1), completions], dim=1)
        logits = model(input_ids=input_ids, logits_to_keep=length + 1, use_cache=False).logits
        return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)

    def score(length):
        with torch.no_grad():
            return logprobs(length)

    def step(length):
        adv = batch(opts, length)[2].unsqueeze(1)
        model.train()
        logp = logprobs(length)
        ratio = torch.exp(logp - logp.detach())
        loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()  # every token is a completion token
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return model, optimizer, step, score


def child(opts) -> dict:
    import torch

    from bench.harness import rss_peak_bytes

    with tempfile.TemporaryDirectory() as workdir:
        if opts.child == "fastrl":
            model, optimizer, step, score = fastrl_step(opts)
        elif opts.child == "eager":
            model, optimizer, step, score = eager_step(opts)
        else:
            model, optimizer, step, score = trl_step(opts, opts.child == "fastrl-trl", workdir)
        names = {p: n for n, p in model.named_parameters()}
        lrs = [g["lr"] for g in optimizer.param_groups]
        for g in optimizer.param_groups:  # the warm-up step leaves the weights as they are: every provider's
            g["lr"] = 0.0  # first timed step starts from the saved weights, so its gradients compare exactly
        start = time.perf_counter()
        step(opts.warmup_length or opts.completion_length)
        warmup_s = time.perf_counter() - start
        for g, lr in zip(optimizer.param_groups, lrs):
            g["lr"] = lr
        # the per-token log-probs of the warm-up batch under the saved weights, by the provider's own code (untimed)
        torch.save(score(opts.warmup_length or opts.completion_length), logp_path(opts.grads_out))
        saving = []

        def save(opt, *_):  # the clipped gradients the first timed step applies, written out (no copy), untimed
            t0 = time.perf_counter()
            torch.save({names[p]: p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None},
                       opts.grads_out)  # fmt: skip
            saving.append(time.perf_counter() - t0)

        hook = optimizer.register_step_pre_hook(save)
        times, losses = [], []

        def timed():
            for _ in range(opts.steps):
                t0 = time.perf_counter()
                losses.append(step(opts.completion_length))
                times.append(time.perf_counter() - t0 - sum(saving))
                hook.remove()
                saving.clear()

        rss_before = status_kib("self", "VmRSS") * 1024
        rise = rss_peak_bytes(timed)
    return dict(provider=opts.child, loss=losses[0], warmup_s=warmup_s, times_s=times, seconds=statistics.median(times),
                peak_mib=(rss_before + rise) / 2**20, rise_mib=rise / 2**20)  # fmt: skip
