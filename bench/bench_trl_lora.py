"""Peak memory of fastrl's TRL head with a frozen head (PEFT LoRA) vs a trainable one (full fine-tuning), on CPU.

Run: ``python -m bench.bench_trl_lora [--vocab 151936] [--hidden 64] [--tokens 1024]``

One forward + backward of `model(..., labels=labels, fused_lm_head=True)` (the call TRL's GRPOTrainer makes,
patched by `add_fastrl_lm_head`) on a random Qwen2 whose head dominates (large vocabulary, small hidden size),
fp32. "lora": adapters on q_proj/v_proj, the head frozen; "full": every parameter trainable. Each mode runs in a
fresh interpreter; the figure is the peak RSS of the step over the RSS just before it, and the run also reports
whether the head got a gradient and whether fastrl's kernel was asked for d_weight (the [V, D] GEMM).
"""

import argparse
import json
import os
import subprocess
import sys

import torch

from bench.harness import rss_peak_bytes
from bench.runenv import memory_child_env

MODES = ("lora", "full")


def child(mode: str, vocab: int, hidden: int, tokens: int) -> dict:
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from fastrl.integrations.trl import add_fastrl_lm_head
    from fastrl.kernels.logprobs import chunked

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).float()
    base = model
    if mode == "lora":
        lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
        base = model.get_base_model()
    add_fastrl_lm_head(base, impl="torch")
    asked = []
    backward = chunked.chunked_backward
    inside = []  # chunked_backward calls itself on the live rows: record the outer call alone

    def recorded(*args):
        if not inside:
            asked.append(bool(args[-1][1]))
        inside.append(True)
        try:
            return backward(*args)
        finally:
            inside.pop()

    chunked.chunked_backward = recorded
    ids = torch.randint(3, vocab, (2, tokens // 2))

    def step():
        out = model(input_ids=ids, labels=ids, fused_lm_head=True)
        out.log_probs.sum().backward()
        return out.loss.detach()

    step()  # warm-up: the first call allocates the optimizer-free steady state (parameter gradients)
    for p in model.parameters():
        p.grad = None
    peak = rss_peak_bytes(step)
    head = base.lm_head.weight
    return {
        "mode": mode, "peak_mib": round(peak / 2**20, 1), "head_grad": head.grad is not None,
        "d_weight_asked": any(asked), "head_mib": round(head.numel() * 4 / 2**20, 1),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--child", choices=MODES)
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(child(opts.child, opts.vocab, opts.hidden, opts.tokens)))
        return
    env = memory_child_env()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    for mode in MODES:
        args = ["--vocab", str(opts.vocab), "--hidden", str(opts.hidden), "--tokens", str(opts.tokens)]
        cmd = [sys.executable, "-m", "bench.bench_trl_lora", "--child", mode, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=900)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        print(lines[-1] if proc.returncode == 0 and lines else f"{mode}: FAILED {proc.stderr[-2000:]}")


if __name__ == "__main__":
    main()
