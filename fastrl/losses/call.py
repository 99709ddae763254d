"""The checked call of the loss entry points: built once by `grpo_loss` / `GRPOLoss` / `policy_loss` / the TRL head,
checked once, then handed to `route.run`, which picks the path. Nothing below the entry re-checks it."""

from dataclasses import dataclass

import torch

from fastrl.kernels import LogprobRequest

from .config import LossConfig

__all__ = ["LossCall", "PolicyInputs"]


@dataclass(frozen=True)
class PolicyInputs:
    """What the policy loss takes besides the current log-probs and entropy (see `policy_loss`)."""

    advantages: torch.Tensor  # [B] or [B, T]
    mask: torch.Tensor  # [B, T] bool or 0/1
    old: torch.Tensor | None  # [B, T] old_logprobs
    ref: torch.Tensor | None  # [B, T] ref_logprobs
    rollout: torch.Tensor | None  # [B, T] rollout_logprobs
    config: LossConfig
    normalizer: object  # a number, a 1-element tensor, a `Normalizer` or None
    impl: str  # "auto", "triton" or "torch"

    @property
    def live(self) -> torch.Tensor:
        return self.mask if self.mask.dtype == torch.bool else self.mask != 0


@dataclass(frozen=True)
class LossCall:
    """One `grpo_loss` call: the head's tensors, the policy inputs and the options of the log-prob pass."""

    hidden: torch.Tensor  # [B, T, D]
    weight: torch.Tensor  # [V, D] (this rank's rows with a process group)
    bias: torch.Tensor | None  # [V] or None
    targets: torch.Tensor  # [B, T], ignore_index wherever mask is 0
    policy: PolicyInputs
    temperature: float | torch.Tensor  # the one temperature: config's, or a [B, T] per-token tensor
    sampler: dict  # top_k / top_p / min_p: numbers, per-row or per-token tensors, or None
    kept: tuple | None  # (kept_ids, kept_offsets) of the live rows, or None
    group: object  # the vocab-parallel process group, or None
    return_entropy: bool  # report the entropy even when the loss does not use it
    batch_invariant: bool
    ignore_index: int = -100

    @property
    def config(self) -> LossConfig:
        return self.policy.config

    @property
    def entropy_wanted(self) -> bool:
        """Whether the pass computes the entropy: the loss uses it, or the caller asked for it."""
        config = self.config
        return config.entropy_coef != 0 or config.top_entropy_quantile < 1 or self.return_entropy

    def logprob_options(self) -> LogprobRequest:
        """The log-prob op's request with the options every path passes alike; each path replaces the rest."""
        return LogprobRequest(bias=self.bias, temperature=self.temperature, ignore_index=self.ignore_index,
                              impl=self.policy.impl, batch_invariant=self.batch_invariant)  # fmt: skip
