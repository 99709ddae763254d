"""One TRL GRPO training step, stock `trl.GRPOTrainer` vs `fastrl.integrations.trl.FastRLGRPOTrainer`, on CPU.

Run: ``python -m bench.bench_trl_step [--batch 4] [--completion 4096] [--vocab 151936] [--hidden 64] [--reps 3]``

The step is the trainer's own `compute_loss` and the backward through it, on one fixed batch of completions
(generation, which both trainers share unchanged, is not timed): a random Qwen2 with the given vocabulary
(the head dominates at a small hidden size), fp32, TRL's default `loss_type="dapo"`. Each trainer runs in a
fresh interpreter: wall time (median and 20/80 quantiles of `--reps` steps after one warm-up) and the peak
RSS of one step over the RSS just before it. The gradients of both runs are compared first; a provider whose
loss or gradients disagree with stock TRL's (relative L2 > 1e-4) is reported as FAIL, without figures.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from bench.harness import environment, quantiles, rss_peak_bytes

PROVIDERS = ("trl", "fastrl")
REL_TOL = 1e-4


def _tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<pad>": 0, "<eos>": 1, "<unk>": 2}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def build(provider: str, opts, workdir: str):
    """(trainer, inputs): a trainer around a seeded random model, and one batch as `_prepare_inputs` returns it."""
    from datasets import Dataset
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from fastrl.integrations.trl import FastRLGRPOTrainer

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=opts.vocab, hidden_size=opts.hidden, intermediate_size=2 * opts.hidden, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=opts.completion + 64,
        tie_word_embeddings=False, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).float()
    args = GRPOConfig(
        output_dir=workdir, use_cpu=True, bf16=False, per_device_train_batch_size=opts.batch,
        num_generations=opts.batch, max_completion_length=opts.completion, report_to="none",
        activation_checkpointing=False, disable_tqdm=True,
    )  # fmt: skip
    cls = FastRLGRPOTrainer if provider == "fastrl" else GRPOTrainer
    data = Dataset.from_dict({"prompt": ["a"] * opts.batch})
    trainer = cls(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                  train_dataset=data, processing_class=_tokenizer())  # fmt: skip
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    g = torch.Generator().manual_seed(1)
    b, t, p = opts.batch, opts.completion, 16
    lengths = torch.randint(t // 2, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None] < lengths[:, None]).long()
    inputs = {
        "prompt_ids": torch.randint(3, opts.vocab, (b, p), generator=g),
        "prompt_mask": torch.ones(b, p, dtype=torch.long),
        "completion_ids": torch.randint(3, opts.vocab, (b, t), generator=g),
        "completion_mask": mask,
        "advantages": torch.randn(b, generator=g),
        "num_items_in_batch": mask.sum(),
    }
    return trainer, inputs


def _step(trainer, inputs):
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach()


def child(provider: str, opts) -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        trainer, inputs = build(provider, opts, workdir)
        _step(trainer, inputs)  # warm-up: thread pools, lazy imports
        peak = rss_peak_bytes(lambda: _step(trainer, inputs))
        times = []
        for _ in range(opts.reps):
            start = time.perf_counter()
            loss = _step(trainer, inputs)
            times.append((time.perf_counter() - start) * 1e3)
        grads = {n: p.grad for n, p in trainer.model.named_parameters() if p.grad is not None}
        torch.save({"loss": loss, "grads": grads}, opts.grads_out)
    median, p20, p80 = quantiles(times)
    return {"provider": provider, "median_ms": median, "p20_ms": p20, "p80_ms": p80, "peak_mib": peak / 2**20}


def _rel(a, b):
    return (a.double() - b.double()).norm().item() / max(a.double().norm().item(), 1e-30)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--completion", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--child", choices=PROVIDERS, help=argparse.SUPPRESS)
    parser.add_argument("--grads-out", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.child:
        print(json.dumps(child(opts.child, opts)))
        return
    results, saved = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for provider in PROVIDERS:
            path = os.path.join(tmp, f"{provider}.pt")
            cmd = [sys.executable, "-m", "bench.bench_trl_step", "--child", provider, "--grads-out", path]
            cmd += [f"--{k}={getattr(opts, k)}" for k in ("batch", "completion", "vocab", "hidden", "reps")]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"{provider} run failed:\n{proc.stderr[-3000:]}")
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            saved[provider] = torch.load(path)
    ref = saved["trl"]
    for row in results:
        got = saved[row["provider"]]
        errors = {"loss": _rel(ref["loss"], got["loss"])}
        errors |= {n: _rel(g, got["grads"][n]) for n, g in ref["grads"].items()}
        row["max_rel_err"] = max(errors.values())
        row["status"] = "ok" if row["max_rel_err"] <= REL_TOL else "FAIL"
        if row["status"] == "FAIL":
            row.update(median_ms=None, p20_ms=None, p80_ms=None, peak_mib=None)
    env = environment(torch.device("cpu"))
    shape = f"B={opts.batch} T={opts.completion} V={opts.vocab} D={opts.hidden}"
    print(f"TRL GRPO step (compute_loss + backward), {shape}, fp32, loss_type=dapo")
    print(f"{'trainer':<22}{'status':<8}{'median s':>10}{'p20-p80 s':>16}{'peak MiB':>10}{'max rel err':>13}")
    names = {"trl": "trl.GRPOTrainer", "fastrl": "FastRLGRPOTrainer"}
    for r in results:
        if r["status"] == "ok":
            spread = f"{r['p20_ms'] / 1e3:.2f}-{r['p80_ms'] / 1e3:.2f}"
            figures = f"{r['median_ms'] / 1e3:>10.2f}{spread:>16}{r['peak_mib']:>10.0f}"
        else:
            figures = f"{'-':>10}{'-':>16}{'-':>10}"
        print(f"{names[r['provider']]:<22}{r['status']:<8}{figures}{r['max_rel_err']:>13.1e}")
    print(json.dumps({k: env[k] for k in env if k in ("torch", "cpu", "load_before", "git_sha")}, default=str))
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump({"env": env, "shape": shape, "results": results}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
