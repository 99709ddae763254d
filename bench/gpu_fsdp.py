"""One FSDP2 training step of a small Hugging Face model with fastrl's update (part of `python -m bench.gpu`).

The model is built from a config with random weights (no download): a Qwen2 of 8 layers, hidden 1024,
V = 151936 on the GPU (a tiny one of 2 layers, hidden 32, V = 512 on CPU for `--dry-run`), sharded with
`fastrl.trainer.fsdp.shard_model` on a one-rank process group (nccl on CUDA, gloo on CPU), then one AdamW
step of `fastrl.trainer.update.train_step` (GRPO token-mean, bf16 gathered weights on the GPU) on 16
random completions of 512 tokens (8 on CPU). Reports the loss, grad norm, step time and the peak memory.
"""

import os
import time

import torch

from fastrl.losses import LossConfig
from fastrl.trainer.batching import Sample


def _batch(n: int, prompt: int, completion: int, vocab: int) -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        p = torch.randint(3, vocab, (prompt,), generator=g).tolist()
        c = torch.randint(3, vocab, (completion - (i % 4) * completion // 8,), generator=g).tolist()
        out.append(Sample(p, c, float(torch.randn(1, generator=g))))
    return out


def main(dry_run: bool) -> dict:
    import torch.distributed as dist
    import transformers

    from fastrl.trainer.fsdp import shard_model
    from fastrl.trainer.update import StepSettings, train_step

    device = torch.device("cpu" if dry_run else "cuda")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    started_pg = not dist.is_initialized()
    if started_pg:
        dist.init_process_group("gloo" if dry_run else "nccl", rank=0, world_size=1)
    try:
        size = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=512) if dry_run else dict(
                    hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                    num_key_value_heads=4, vocab_size=151936)  # fmt: skip
        cfg = transformers.Qwen2Config(**size, tie_word_embeddings=False)
        torch.manual_seed(0)
        model = transformers.Qwen2ForCausalLM(cfg).to(device)
        params = sum(p.numel() for p in model.parameters())
        model = shard_model(model, param_dtype=None if dry_run else torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        samples = _batch(8 if dry_run else 16, 16 if dry_run else 128, 8 if dry_run else 512, size["vocab_size"])
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        settings = StepSettings(LossConfig(loss_agg="token-mean"), 4096 if not dry_run else 64, True, 0, impl="auto",
                                bf16=not dry_run)  # fmt: skip
        metrics = train_step(model, opt, samples, settings)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    finally:
        if started_pg:
            dist.destroy_process_group()
    ok = all(map(lambda x: x == x and abs(x) != float("inf"), (metrics["loss"], metrics["grad_norm"])))
    ok = ok and metrics["update_skipped"] == 0.0 and metrics["num_tokens"] > 0
    row = dict(params=params, tokens=metrics["num_tokens"], loss=metrics["loss"], grad_norm=metrics["grad_norm"],
               seconds=seconds, peak_gib=peak, pass_=ok)  # fmt: skip
    table = (
        "| model | params | tokens | loss | grad norm | step s | peak GiB | status |\n"
        "|---|---|---|---|---|---|---|---|\n"
        f"| Qwen2 {size['num_hidden_layers']}L h{size['hidden_size']} V{size['vocab_size']} (random, FSDP2 1 rank) "
        f"| {params / 1e6:.1f}M | {row['tokens']:.0f} | {row['loss']:.4f} | {row['grad_norm']:.3g} | {seconds:.2f} | "
        f"{'—' if peak is None else f'{peak:.1f}'} | {'ok' if ok else 'FAIL'} |"
    )
    return {"row": row, "table": table, "pass": ok}
