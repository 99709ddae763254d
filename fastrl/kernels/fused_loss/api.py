"""Entry points of the gradient-in-forward op: log-probs and the gradients of a per-token loss, one pass.

`fused_logprob_grads` takes any per-token loss (a `token_grad` callback); `policy_loss_grads` is it for
the policy loss of docs/math.md §2 (§7 describes the pass).
"""

import torch

from ..dispatch import resolve_impl
from ..logits import no_autocast
from ..logprobs.checks import check_call, check_targets_range
from ..policy import PolicyLossParams
from .chunked import fused_forward
from .params import FusedLossParams
from .tokens import PolicyTokens

__all__ = ["fused_logprob_grads", "policy_loss_grads"]


def fused_logprob_grads(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    token_grad,
    *,
    bias: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    ignore_index: int = -100,
    entropy: bool = False,
    entropy_grad: bool = True,
    impl: str = "auto",
    batch_invariant: bool = False,
):
    """Per-token logp (and entropy) and, from the same pass, the gradients of L = Σ ℓ(logp, H).

    Args:
        hidden: `[..., D]`; weight: `[V, D]`; targets: `[...]` int (`ignore_index` rows are left out).
        token_grad: `(flat rows [C], logp [C], entropy [C] | None) → (∂L/∂logp [C], ∂L/∂H [C] | None)`,
            called once per chunk of live tokens, in order.
        bias: `[V]` or None. temperature: a float > 0 or a tensor of targets' shape.
        entropy: compute the entropy (token_grad may then return ∂L/∂H, or None when L does not use it).
        entropy_grad: False promises that token_grad returns None for ∂L/∂H (the entropy is a metric), which
            lets the float32 CPU walk form the entropy from its d_hidden GEMM (lean.py); a ∂L/∂H then raises.
        impl: "auto", "triton" (Triton fold / ∂z epilogue, GEMMs in torch) or "torch".
        batch_invariant: a token's logp, entropy and d_hidden row are the same bits whichever tokens share the
            call (docs/math.md §1.2): every chunk is padded to the full row count.

    Returns:
        logp `[...]`, entropy `[...]` or None (float32, detached), and (d_hidden, d_weight, d_bias):
        ∂L/∂hidden, ∂L/∂weight, ∂L/∂bias in the inputs' dtypes, None where the input needs no gradient.
    """
    check_call(hidden, weight, targets, bias, temperature, ignore_index)
    per_token = isinstance(temperature, torch.Tensor)
    impl = resolve_impl(impl, hidden.device)
    targets = targets.long()
    check_targets_range(targets, weight.shape[0], int(ignore_index))
    lead = targets.shape
    flat = torch.where(targets == ignore_index, -1, targets).reshape(-1)
    tau = temperature.float().reshape(-1) if per_token else float(temperature)
    needs = tuple(t is not None and t.requires_grad for t in (hidden, weight, bias))
    if not isinstance(batch_invariant, bool):
        raise TypeError(f"batch_invariant must be a bool, got {batch_invariant!r}")
    params = FusedLossParams(impl, bool(entropy), needs, bool(entropy_grad), batch_invariant)
    with torch.no_grad(), no_autocast(hidden):
        h2 = hidden.detach().reshape(flat.numel(), hidden.shape[-1])
        b = None if bias is None else bias.detach()
        logp, ent, grads = fused_forward(h2, weight.detach(), b, flat, tau, token_grad, params)
    d_hidden = None if grads[0] is None else grads[0].reshape(hidden.shape)
    return logp.reshape(lead), None if ent is None else ent.reshape(lead), (d_hidden, grads[1], grads[2])


def policy_loss_grads(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    old: torch.Tensor | None,
    ref: torch.Tensor | None,
    token_weight: torch.Tensor | None,
    params: PolicyLossParams,
    row_weight: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    ignore_index: int = -100,
    entropy: bool = False,
    impl: str = "auto",
    batch_invariant: bool = False,
):
    """Log-probs, entropy and the gradients of L = Σ_b row_weight_b · Σ_t m·ℓ_t, from one pass.

    Args:
        hidden: `[B, T, D]`; weight: `[V, D]`; targets: `[B, T]` (`ignore_index` where mask is 0).
        advantages, mask, old, ref, params: as for `policy_rows` (a token-level ratio); token_weight: its
            detached `weight` of the policy term, which must not depend on the current log-probs.
        row_weight: `[B]` ∂L/∂row_loss of the aggregation. bias, temperature, ignore_index, impl: as for
            `fused_logprob_grads`; entropy: compute it (forced on when params.entropy_coef != 0); batch_invariant:
            as for `fused_logprob_grads`.

    Returns:
        logp `[B, T]`, entropy `[B, T]` or None, and (d_hidden, d_weight, d_bias) as `fused_logprob_grads`.
    """
    if params.ratio_level != "token":
        raise ValueError(f"the gradient-in-forward path needs a token-level ratio, got {params.ratio_level!r}")
    impl = resolve_impl(impl, hidden.device)
    token_grad = PolicyTokens(advantages, mask, old, ref, token_weight, params, row_weight, impl)
    return fused_logprob_grads(
        hidden,
        weight,
        targets,
        token_grad,
        bias=bias,
        temperature=temperature,
        ignore_index=ignore_index,
        entropy=entropy or params.entropy_coef != 0,
        entropy_grad=params.entropy_coef != 0,
        impl=impl,
        batch_invariant=batch_invariant,
    )
