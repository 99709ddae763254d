"""The small uneven batch the multi-rank step tests split over their ranks, and their small Qwen2 model."""

import torch

from fastrl.trainer.batching import Sample


def uneven_batch(n: int = 8) -> list[Sample]:
    """`n` samples of random prompts and completions; the first half's completions grow twice as fast, so
    rank 0 of 2 holds more tokens than rank 1 and a per-rank mean would be wrong."""
    g = torch.Generator().manual_seed(5)
    out = []
    for i in range(n):
        p = torch.randint(3, 60, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        c = torch.randint(3, 60, (1 + i * (2 if i < n // 2 else 1),), generator=g).tolist()
        out.append(Sample([1] + p, c, float(torch.randn(1, generator=g))))
    return out


def qwen2(kv_heads: int, vocab: int = 64):
    """A 2-layer Qwen2 built from config: 4 attention heads, `kv_heads` key/value heads, q/k/v biases drawn (zero
    at initialisation), an untied head, SDPA attention; the same weights on every call."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=kv_heads, max_position_embeddings=128, tie_word_embeddings=False,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return model
