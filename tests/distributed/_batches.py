"""The small uneven batch the multi-rank step tests split over their ranks."""

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
