"""The frozen parameters of the gradient-in-forward loss op."""

from dataclasses import dataclass

__all__ = ["FusedLossParams"]


@dataclass(frozen=True)
class FusedLossParams:
    impl: str  # "torch" (the fold in torch ops) or "triton" (the fold / ∂z epilogue as Triton kernels)
    entropy: bool  # compute the entropy (for the loss's bonus or as a metric)
    needs: tuple[bool, bool, bool]  # gradients wanted for (hidden, weight, bias)
    entropy_grad: bool = True  # token_grad may return ∂L/∂H (False: the entropy is a metric only)
    batch_invariant: bool = False  # every chunk padded to the full row count: a token's results never follow N
