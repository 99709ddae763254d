"""`token_logprobs`: the public entry point of the log-prob op and its input checks (docs/math.md §1, §5)."""

import numbers

import torch

from ..dispatch import resolve_impl, token_logprobs_impl
from .params import MIN_TEMPERATURE, LogprobParams
from .sampled import SampledLogprobs, token_logprobs_sampled
from .sampling import truncation

__all__ = ["check_call", "check_temperature", "sampled_token_logprobs", "token_logprobs"]


def check_temperature(temperature, shape: tuple, device: torch.device) -> None:
    """A per-token temperature: a floating tensor of `shape` on `device`, finite and > 0 everywhere."""
    if not temperature.is_floating_point():
        raise TypeError(f"a temperature tensor must be floating, got dtype {temperature.dtype}")
    if tuple(temperature.shape) != tuple(shape):
        raise ValueError(f"a temperature tensor must have shape {tuple(shape)}, got {tuple(temperature.shape)}")
    if temperature.device != device:
        raise ValueError(f"a temperature tensor must be on {device}, got {temperature.device}")
    bad = ~(temperature.isfinite() & (temperature > 0))
    if temperature.numel() and bool(bad.any()):
        raise ValueError(f"temperature must be finite and > 0 everywhere, found {float(temperature[bad][0])}")


def _check_inputs(hidden, weight, targets, bias, temperature, sharded: bool = False) -> None:
    """Raise TypeError/ValueError naming the bad value; see `token_logprobs` for the contract."""
    for name, t in (("hidden", hidden), ("weight", weight), ("targets", targets)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not hidden.is_floating_point():
        raise TypeError(f"hidden must be a floating tensor, got dtype {hidden.dtype}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be [V, D], got shape {tuple(weight.shape)}")
    if weight.shape[0] == 0 and not sharded:  # a vocab-parallel rank may hold no rows; the whole head may not
        raise ValueError(f"weight must hold at least one token (V >= 1), got shape {tuple(weight.shape)}")
    if hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"hidden's last dim must equal weight's D: hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)}"
        )
    fp32_head = weight.dtype == torch.float32 and hidden.dtype in (torch.float16, torch.bfloat16)
    if weight.dtype != hidden.dtype and not fp32_head:
        raise TypeError(
            f"hidden and weight must share a dtype (or be half-precision with a float32 head), got {hidden.dtype} "
            f"and {weight.dtype} (under torch.autocast the LM body returns low-precision hidden states)"
        )
    if weight.device != hidden.device:
        raise ValueError(f"hidden and weight must be on one device, got {hidden.device} and {weight.device}")
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise TypeError(f"targets must be an integer tensor, got dtype {targets.dtype}")
    if tuple(targets.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(
            f"targets shape {tuple(targets.shape)} must equal hidden's leading shape {tuple(hidden.shape[:-1])}"
        )
    if targets.device != hidden.device:
        raise ValueError(f"targets must be on hidden's device {hidden.device}, got {targets.device}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"bias must be [V] = [{weight.shape[0]}], got shape {tuple(bias.shape)}")
        if bias.dtype != weight.dtype or bias.device != hidden.device:
            raise TypeError(
                f"bias must match weight's dtype and hidden's device ({weight.dtype}, {hidden.device}), "
                f"got ({bias.dtype}, {bias.device})"
            )
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a float, got {type(temperature).__name__}")
    if not MIN_TEMPERATURE <= temperature < float("inf"):
        raise ValueError(
            f"temperature must be a finite number >= {MIN_TEMPERATURE} (smaller ones overflow float32 logits), "
            f"got {temperature}"
        )


def check_call(hidden, weight, targets, bias, temperature, ignore_index) -> None:
    """The checks every hidden-states op shares: shapes, dtypes and devices, the temperature (a float, or a
    per-token tensor shaped like targets) and an int `ignore_index`; raises naming the bad value."""
    per_token = isinstance(temperature, torch.Tensor)
    _check_inputs(hidden, weight, targets, bias, 1.0 if per_token else temperature)
    if per_token:
        check_temperature(temperature, targets.shape, hidden.device)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__} {ignore_index!r}")


def _check_targets_range(targets: torch.Tensor, vocab: int, ignore_index: int) -> None:
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= vocab))
    if targets.numel() and bool(bad.any()):
        value = int(targets[bad][0])
        raise ValueError(f"target {value} is outside [0, {vocab}) and is not ignore_index={ignore_index}")


def token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    ignore_index: int = -100,
    return_entropy: bool = False,
    impl: str = "auto",
    process_group=None,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    min_p: float | torch.Tensor | None = None,
    softcap: float | None = None,
    return_topk: int | None = None,
):
    """Log-probability of each target token, straight from hidden states and the LM-head weight.

    Never materializes the `[N, V]` logits, forward or backward (docs/math.md §1).

    Args:
        hidden: `[..., D]` float16/bfloat16/float32 hidden states (the LM body's output).
        weight: `[V, D]` LM-head weight, same dtype and device as hidden.
        targets: `[...]` integer token ids (hidden's leading shape); `ignore_index` rows give 0.
        bias: optional `[V]` LM-head bias.
        temperature: logits are divided by it: a float >= 1e-6 (`MIN_TEMPERATURE`), or a tensor of targets'
            shape (one temperature per token, e.g. a sampler's per-sample one broadcast; not with a bias).
        ignore_index: target value whose rows get logp = entropy = 0 and no gradient.
        return_entropy: also return the softmax entropy per token (differentiable).
        impl: "auto" (Triton on CUDA, chunked PyTorch elsewhere), "triton" or "torch".
        process_group: vocab-parallel head (docs/math.md §6): `weight` (and `bias`) are this rank's block of
            rows, in rank order (e.g. `W.tensor_split(P)[rank]`, sizes may differ; or a DTensor sharded on
            dim 0 over this group), while hidden and targets are the full ones on every rank. The result and
            d_hidden equal the unsharded call's on every rank; d_weight / d_bias are this rank's rows.
            Every rank of the group must make the call.
        top_k, top_p, min_p: vLLM's sampler truncation (docs/math.md §8), in its order (min-p, top-k, top-p on
            what is left): logp and entropy are those of the kept set's renormalized softmax. Each a number, or a
            per-row `[B]` (targets' first dim) / per-token (targets' shape) tensor; None, top_k <= 0 or >= V,
            top_p = 1 and min_p = 0 are off and cost nothing. Not with process_group.
        softcap: the model's final-logit soft-cap `cap·tanh(x / cap)`, applied before the temperature.
        return_topk: k: also return the ids `[..., k]` (int64) and log-probs `[..., k]` (float32, no gradient) of
            the k most likely tokens of the (truncated) distribution; −inf for a token outside the kept set.

    Returns:
        logp `[...]` float32, or `(logp, entropy)` with return_entropy=True; with return_topk the two top-k
        tensors follow: `(logp, [entropy,] topk_ids, topk_logprobs)`.

    A float32 head with bfloat16/float16 hidden states (TRL's `cast_lm_head_to_fp32`) computes the logits in
    float32 as that head does; d_hidden comes back in hidden's dtype, d_weight in float32.

    Both implementations compute in the inputs' dtype whatever torch.autocast says: under autocast,
    cast the LM body's output and the head weight to one dtype first. Differentiable once (a second
    derivative raises). An ignored row's hidden state may be inf/NaN (padding) on both paths: it never
    reaches an output or a gradient.
    """
    if process_group is not None:
        from .vocab_parallel import resolve_shard

        weight, bias, process_group = resolve_shard(weight, bias, process_group)
    elif hasattr(weight, "device_mesh"):
        raise TypeError(
            "weight is a DTensor: pass process_group= for a vocab-parallel call (hidden and targets identical on "
            "every rank), or gather it into a plain tensor first"
        )
    if any(x is not None for x in (top_k, top_p, min_p, softcap, return_topk)):
        if process_group is not None:
            raise ValueError("top_k / top_p / min_p / softcap / return_topk are not supported with process_group")
        out = sampled_token_logprobs(
            hidden, weight, targets, bias=bias, temperature=temperature, ignore_index=ignore_index,
            return_entropy=return_entropy, impl=impl, top_k=top_k, top_p=top_p, min_p=min_p, softcap=softcap,
            return_topk=return_topk,
        )  # fmt: skip
        res = (out.logp,) + ((out.entropy,) if return_entropy else ())
        res += (out.topk_ids, out.topk_logprobs) if return_topk is not None else ()
        return res[0] if len(res) == 1 else res
    per_token = isinstance(temperature, torch.Tensor)
    _check_inputs(hidden, weight, targets, bias, 1.0 if per_token else temperature, sharded=process_group is not None)
    if hidden.dtype != weight.dtype:
        hidden = hidden.to(weight.dtype)  # an O(N·D) float32 copy; autograd casts d_hidden back
    if per_token:
        check_temperature(temperature, targets.shape, hidden.device)
        if bias is not None:
            raise ValueError("token_logprobs takes a per-token temperature only without a bias (grpo_loss takes both)")
        # z_t / τ_t = (h_t / τ_t)·Wᵀ: the row scale moves onto hidden, and autograd carries it into d_hidden
        hidden = hidden / temperature.to(hidden.dtype).unsqueeze(-1)
        temperature = 1.0
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__} {ignore_index!r}")
    ignore_index = int(ignore_index)
    impl = resolve_impl(impl, hidden.device)
    wide_ignore = not -(2**31) <= ignore_index < 2**31
    if targets.dtype != torch.int64 and (wide_ignore or targets.dtype != torch.int32):
        # A narrower dtype wraps ignore_index in comparisons (uint8 156 == -100, int32 0 == 2**40).
        targets = targets.long()
    vocab, first_row = weight.shape[0], 0
    if process_group is not None:
        from .vocab_parallel import shard_layout

        first_row, vocab = shard_layout(weight.shape[0], process_group, hidden.device)
        if vocab == 0:
            raise ValueError("weight must hold at least one token (V >= 1) over the ranks of process_group, got 0")
    _check_targets_range(targets, vocab, ignore_index)
    if wide_ignore:
        # The kernels compare targets in int32: move an ignore_index beyond that range to -1, which the
        # range check above guarantees is not a real target.
        targets = torch.where(targets == ignore_index, -1, targets)
        ignore_index = -1
    params = LogprobParams(float(temperature), int(ignore_index), bool(return_entropy))
    lead = targets.shape
    h2 = hidden.reshape(targets.numel(), hidden.shape[-1])  # not -1: D = 0 or N = 0 leave -1 ambiguous
    t1 = targets.reshape(-1)
    if process_group is not None:
        from .vocab_parallel import token_logprobs_vocab_parallel

        logp, entropy = token_logprobs_vocab_parallel(h2, weight, t1, bias, params, process_group, impl, first_row)
    else:
        logp, entropy = token_logprobs_impl(impl)(h2, weight, t1, bias, params)
    logp = logp.reshape(lead)
    return (logp, entropy.reshape(lead)) if return_entropy else logp


def _check_softcap(softcap):
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a float or None, got {type(softcap).__name__} {softcap!r}")
    if not 0 < softcap < float("inf"):
        raise ValueError(f"softcap must be finite and > 0, got {softcap}")
    return float(softcap)


def sampled_token_logprobs(
    hidden, weight, targets, *, bias=None, temperature=1.0, ignore_index=-100, return_entropy=False, impl="auto",
    top_k=None, top_p=None, min_p=None, softcap=None, return_topk=None,
) -> SampledLogprobs:  # fmt: skip
    """`token_logprobs` with the sampler's options (docs/math.md §8), every output in one SampledLogprobs shaped
    like targets, `outside` included (the target is not in the kept set; all False when nothing is dropped)."""
    check_call(hidden, weight, targets, bias, temperature, ignore_index)
    per_token = isinstance(temperature, torch.Tensor)
    softcap = _check_softcap(softcap)
    vocab, lead = weight.shape[0], targets.shape
    trunc = truncation(top_k, top_p, min_p, lead, vocab, hidden.device)
    if return_topk is not None and (
        isinstance(return_topk, bool) or not isinstance(return_topk, numbers.Integral) or not 0 < return_topk <= vocab
    ):
        raise ValueError(f"return_topk must be None or an int in [1, V={vocab}], got {return_topk!r}")
    if trunc is None and softcap is None and return_topk is None:  # everything off: the plain op, at no cost
        out = token_logprobs(hidden, weight, targets, bias=bias, temperature=temperature, ignore_index=ignore_index,
                             return_entropy=return_entropy, impl=impl)  # fmt: skip
        logp, entropy = out if return_entropy else (out, None)
        return SampledLogprobs(logp, entropy, torch.zeros(lead, dtype=torch.bool, device=hidden.device), None, None)
    impl = resolve_impl(impl, hidden.device)
    targets = targets.long()
    _check_targets_range(targets, vocab, int(ignore_index))
    if not -(2**31) <= ignore_index < 2**31:
        targets = torch.where(targets == ignore_index, -1, targets)
        ignore_index = -1
    h2 = hidden.reshape(targets.numel(), hidden.shape[-1])
    tau = temperature.reshape(-1).float() if per_token else float(temperature)
    if impl == "triton" and (per_token or h2.dtype != weight.dtype):
        if per_token and softcap is None and bias is None:
            h2, tau = h2 / tau.to(h2.dtype).unsqueeze(-1), 1.0  # z_t / τ_t = (h_t / τ_t)·Wᵀ without bias or cap
        elif per_token:
            impl = "torch"  # the Triton kernels take one temperature: per-token τ with a soft-cap or bias runs here
        h2 = h2.to(weight.dtype)
    params = LogprobParams(tau if isinstance(tau, float) else 1.0, int(ignore_index), bool(return_entropy), softcap)
    out = token_logprobs_sampled(h2, weight, targets.reshape(-1), bias, tau, trunc, params, impl, return_topk)
    k = return_topk
    return SampledLogprobs(
        out.logp.reshape(lead),
        None if out.entropy is None else out.entropy.reshape(lead),
        out.outside.reshape(lead),
        None if k is None else out.topk_ids.reshape(*lead, k),
        None if k is None else out.topk_logprobs.reshape(*lead, k),
    )
