"""The float32 logit tile every PyTorch walk builds, and the autocast guard they share (docs/math.md §1, §8).

One function builds the final logits of a block of rows, z = softcap(x·Wᵀ + b) / τ, in either layout: row-major
`[C, V]` (the token walks and the vocabulary walks) or vocab-major `[V, C]` (the float32 CPU walks, see
logprobs/vocab_major.py). The per-token temperature rule lives here too (`divide_rows`): a row's final logits,
and the chain factor of its gradient, are divided by its τ, after the soft-cap and the bias.
"""

import torch

__all__ = ["divide_rows", "logit_tile", "no_autocast", "softcap_"]


def no_autocast(hidden: torch.Tensor):
    """A context that turns autocast off on hidden's device. The tiles run in the inputs' dtype, as the Triton
    kernels do: under autocast the forward would use bf16 logits and the backward (usually outside the context)
    fp32 ones, p = exp(z − lse) would not sum to 1 and the gradient would be wrong."""
    return torch.autocast(hidden.device.type, enabled=False)


def divide_rows(x: torch.Tensor, tau, vocab_major: bool = False) -> torch.Tensor:
    """x / τ in place, τ a float or one value per row (`[C]`): a division, as eager's z / τ (a multiply by a
    rounded 1/τ is off by an ulp of z / τ, which p = exp(·) magnifies). Rows are x's first dim, or its last one
    for a vocab-major `[V, C]` tile."""
    if isinstance(tau, torch.Tensor):
        return x.div_(tau if vocab_major else tau.unsqueeze(-1))
    return x if tau == 1.0 else x.div_(tau)


def softcap_(z: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap·tanh(z / cap) in place (None: off)."""
    return z if cap is None else z.div_(cap).tanh_().mul_(cap)


def _product(a, b, bias, out, fp32_product: bool):
    # a @ b (+ bias) as float32 into `out` (or a new tensor)
    if fp32_product:
        # a half-precision product kept in float32 (cuBLAS's out_dtype) where the device can; the bias added after
        out = torch.empty(a.shape[0], b.shape[1], dtype=torch.float32, device=a.device) if out is None else out
        if a.dtype == torch.float32:
            torch.mm(a, b, out=out)
        elif a.is_cuda and a.dtype in (torch.float16, torch.bfloat16):
            torch.mm(a, b, out_dtype=torch.float32, out=out)
        else:
            out.copy_(a @ b)
        return out if bias is None else out.add_(bias)
    if a.dtype == torch.float32 and out is not None:
        return torch.mm(a, b, out=out) if bias is None else torch.addmm(bias, a, b, out=out)
    z = a @ b if bias is None else torch.addmm(bias, a, b)  # in the inputs' dtype, as an eager Linear's
    return z.float() if out is None else out.copy_(z)


def logit_tile(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    softcap: float | None = None,
    tau: float | torch.Tensor = 1.0,
    out: torch.Tensor | None = None,
    vocab_major: bool = False,
    fp32_product: bool = False,
) -> torch.Tensor:
    """`[C, D]` rows → float32 final logits z = softcap(x·Wᵀ + b) / τ, `[C, V]` (or `[V, C]` with vocab_major).

    Args:
        x: `[C, D]` rows; a half-precision x with a float32 head is upcast here, a tile at a time (the logits of
            an fp32 head). weight: `[V, D]` (or a slab of its rows); bias: `[V]` or None.
        softcap: the model's final-logit cap (None: off), applied before τ.
        tau: a float or a `[C]` tensor, one temperature per row (`divide_rows`).
        out: a float32 buffer of the result's shape to write into (reused across chunks).
        vocab_major: build `W·xᵀ`, `[V, C]` (the faster GEMM layout of the float32 CPU walks).
        fp32_product: keep a half-precision product in float32 (CUDA), the bias added in float32 after it; by
            default the product is rounded to the inputs' dtype, as an eager Linear's.
    """
    if x.dtype != weight.dtype:
        x = x.to(weight.dtype)
    if vocab_major:
        b = None if bias is None else bias.unsqueeze(-1)
        z = _product(weight, x.T, b, out, fp32_product)
    else:
        z = _product(x, weight.T, bias, out, fp32_product)
    return divide_rows(softcap_(z, softcap), tau, vocab_major)
