"""Randomized batches for the peer parity tests: ragged masks, an all-zero row, a zero-std group,
off-policy log ratios up to ±5, inputs rounded through bf16 or fp32 and then compared in float64."""

import torch

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
B, T, GROUP = 12, 12, 4
MICRO_BATCHES = ([0, 1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11])


def make_batch(dtype: str, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.rand(*shape, generator=g, dtype=torch.float64)

    logp = -rnd(B, T) * 3
    # per-row spread of the log ratios: on-policy-ish, moderate, up to ±5
    spread = torch.tensor([2.0, 5.0, 1.0, 0.3, 0.05, 5.0, 0.5, 1.0, 3.0, 0.1, 5.0, 1.5], dtype=torch.float64)[:, None]
    old = logp + spread * (2 * rnd(B, T) - 1)
    ref = logp + spread * (2 * rnd(B, T) - 1)
    rollout = old + 0.4 * (2 * rnd(B, T) - 1)
    entropy = rnd(B, T) * 3
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    mask &= rnd(B, T) > 0.15  # holes inside the completions
    mask[2] = False  # an all-zero row
    mask[0, 0] = True
    rewards = torch.randint(0, 2, (B,), generator=g).to(torch.float64)
    rewards[:2] = torch.tensor([1.0, 0.0])  # both signs in the first group
    rewards[GROUP : 2 * GROUP] = 1.0  # the second group has zero std: advantages 0
    rewards[2 * GROUP :] = torch.tensor([0.0, 1.0, 0.0, 0.0])
    grouped = rewards.view(-1, GROUP)
    adv = ((grouped - grouped.mean(-1, keepdim=True)) / (grouped.std(-1, keepdim=True) + 1e-4)).reshape(B)
    adv = adv + 0.3 * (2 * rnd(B) - 1) * (adv != 0)
    cast = DTYPES[dtype]
    out = dict(logp=logp, old=old, ref=ref, rollout=rollout, entropy=entropy, adv=adv)
    out = {k: v.to(cast).double() for k, v in out.items()}
    out["mask"] = mask
    return out


# Both sides compute in float64 from the same float64 inputs: they differ only by rounding, ~1e-15 of the
# magnitudes summed (worst seen: 6e-15 against TRL; 3e-13 against verl on a loss of -2e-4 whose O(1) terms
# cancel, an absolute difference of 7e-17). So 1e-12 relative, with the scale floored at 1e-3 (an absolute
# floor of 1e-15 for values that cancel to ~0): a misplaced epsilon or clamp of 1e-10 or more fails.
TOL = 1e-12
SCALE_FLOOR = 1e-3


def err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference relative to max(the reference's largest magnitude, SCALE_FLOOR)."""
    a, b = a.double(), b.double()
    return (a - b).abs().max().item() / max(b.abs().max().item(), SCALE_FLOOR)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference relative to the reference's largest magnitude (0 when both are 0)."""
    a, b = a.double(), b.double()
    scale = b.abs().max().item()
    diff = (a - b).abs().max().item()
    return diff / scale if scale > 0 else diff
