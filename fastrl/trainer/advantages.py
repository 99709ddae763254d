"""Group-relative advantages (GRPO, docs/math.md §4) and zero-variance group filtering.

    A_i = (R_i - mean_g R) / (std_g R + eps)          scale="std"        (GRPO / DeepSeekMath)
    A_i = (R_i - mean_g R) / (std_batch R + eps)      scale="batch-std"  (one scale for the whole batch)
    A_i =  R_i - mean_g R                             scale="none"       (Dr. GRPO: no std bias)

Completions arrive grouped: rows [g*G, (g+1)*G) are the G samples of prompt g. Standard deviations are the
unbiased sample std (torch's default, as in the GRPO reference implementations).
"""

import torch

EPS = 1e-4
SCALES = ("std", "batch-std", "none")


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale: str = "std", eps: float = EPS, batch_std: float | None = None
) -> torch.Tensor:
    """Advantages `[N]` from rewards `[N]` (N = groups * group_size), grouped consecutively.

    Args:
        rewards: `[N]` float rewards.
        group_size: G, the completions per prompt; N must be a multiple of it.
        scale: "std", "batch-std" or "none".
        eps: added to the std so a zero-variance group gives advantages 0, not NaN.
        batch_std: for "batch-std" under data parallelism, the std over ALL ranks' rewards (the caller
            all-reduces it); default: the std of `rewards`.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    if not torch.isfinite(rewards).all():
        raise ValueError(f"rewards must be finite, got {rewards[~torch.isfinite(rewards)][0].item()}")
    r = rewards.float().view(-1, group_size)
    centered = r - r.mean(dim=1, keepdim=True)
    if scale == "none":
        return centered.view(-1)
    if scale == "batch-std":
        std = batch_std if batch_std is not None else (rewards.float().std().item() if rewards.numel() > 1 else 0.0)
        return (centered / (std + eps)).view(-1)
    if group_size == 1:
        raise ValueError("scale='std' needs group_size >= 2 (the std of one sample is undefined)")
    return (centered / (r.std(dim=1, keepdim=True) + eps)).view(-1)


def zero_std_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """`[N // G]` bool: groups whose rewards are all equal (all right or all wrong: no learning signal)."""
    r = rewards.view(-1, group_size)
    return (r == r[:, :1]).all(dim=1)
