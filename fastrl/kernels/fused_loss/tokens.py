"""The policy op seen one token at a time: the per-token loss derivatives a fused chunk needs.

For a token-level ratio the loss of token t depends only on its own logp_t and H_t (docs/math.md §2),
and the aggregation (§3) is linear in the per-sequence sums, with weights c_b = ∂L/∂row_loss_b that
depend only on the mask and the normalizer. So each chunk's tokens go through the policy op itself
(`policy_rows`, as one-token rows) and autograd gives ∂L/∂logp_t = c_b·∂ℓ_t/∂logp_t (and ∂L/∂H_t):
whatever terms the op has, the fused path has them too.
"""

import torch

from ..policy import PolicyLossParams, policy_rows

__all__ = ["PolicyTokens"]


def _flat(t):
    return None if t is None else t.reshape(-1)


class PolicyTokens:
    """`token_grad` of `fused_forward` for a `[B, T]` batch; `row_weight` `[B]` is ∂L/∂row_loss."""

    def __init__(self, advantages, mask, old, ref, weight, params: PolicyLossParams, row_weight, impl: str):
        b, t = mask.shape
        adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1).expand(b, t)
        self.adv, self.mask = _flat(adv), _flat(mask)
        self.old, self.ref, self.weight = _flat(old), _flat(ref), _flat(weight)
        self.params, self.impl, self.t = params, impl, t
        self.row_weight = row_weight.float()

    def __call__(self, idx, logp, entropy):
        """Flat token indices `[C]`, their logp and entropy `[C]` → (∂L/∂logp `[C]`, ∂L/∂H `[C]` or None)."""

        def col(x):
            return None if x is None else x.index_select(0, idx).unsqueeze(-1)

        with_entropy_grad = entropy is not None and self.params.entropy_coef != 0
        with torch.enable_grad():
            lp = logp.detach().unsqueeze(-1).requires_grad_()
            h = None if entropy is None else entropy.detach().unsqueeze(-1).requires_grad_(with_entropy_grad)
            row_loss, _ = policy_rows(
                lp,
                col(self.adv),
                col(self.mask),
                col(self.old),
                col(self.ref),
                col(self.weight),
                h,
                self.params,
                impl=self.impl,
            )
            rows = torch.div(idx, self.t, rounding_mode="floor")
            weighted = (row_loss * self.row_weight.index_select(0, rows)).sum()
            inputs = (lp, h) if with_entropy_grad else (lp,)
            if weighted.requires_grad:
                grads = torch.autograd.grad(weighted, inputs, allow_unused=True)
            else:  # every token's ratio is clipped and nothing else depends on logp
                grads = (None,) * len(inputs)
        grads = [torch.zeros_like(logp) if g is None else g.reshape(-1).float() for g in grads]
        return grads[0], grads[1] if with_entropy_grad else None
