"""Eager full-logits reference: the test oracle and the benchmark baseline.

This is what TRL and most eager RL code do today: build the `[N, V]` logits, take a float32
log-softmax and gather one entry per row. Memory is O(N·V); the math is docs/math.md §1.
"""

import torch

from .params import LogprobParams

__all__ = ["sampled_logits", "sampled_logprobs_reference", "token_logprobs_reference"]


def token_logprobs_reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    params: LogprobParams = LogprobParams(),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropy) by materializing the logits.

    Args:
        hidden: `[N, D]`. weight: `[V, D]`. targets: `[N]` int. bias: `[V]` or None.
    Returns:
        (logp `[N]` float32, entropy `[N]` float32 or None). Computation runs in float32 unless
        the inputs are float64 (then float64, for ground truths).
    """
    compute = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    z = logits.to(compute) / params.temperature
    logp_all = torch.log_softmax(z, dim=-1)
    valid = targets != params.ignore_index
    safe = torch.where(valid, targets, torch.zeros_like(targets))
    logp = logp_all.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    logp = torch.where(valid, logp, torch.zeros_like(logp))
    entropy = None
    if params.return_entropy:
        p = logp_all.exp()
        entropy = -(p * logp_all).sum(-1)
        entropy = torch.where(valid, entropy, torch.zeros_like(entropy))
    out_dtype = torch.float64 if compute == torch.float64 else torch.float32
    return logp.to(out_dtype), None if entropy is None else entropy.to(out_dtype)


def _vllm_kept(z: torch.Tensor, top_k, top_p, min_p) -> torch.Tensor:
    """`[N, V]` bool: the tokens vLLM's sampler keeps, by its rules on materialized logits (docs/math.md §8).

    top_k, top_p, min_p: None or `[N]` tensors (k ≤ 0 or ≥ V, p = 1, min_p = 0 mean off on that row)."""
    n, v = z.shape
    kept = torch.ones_like(z, dtype=torch.bool)
    if min_p is not None:
        prob = torch.softmax(z, -1)
        floor = min_p.to(z.dtype).unsqueeze(-1) * prob.amax(-1, keepdim=True)
        kept &= ~((prob < floor) & (min_p > 0).unsqueeze(-1))
    if top_k is not None:
        masked = z.masked_fill(~kept, float("-inf"))
        ranked = masked.sort(-1, descending=True).values
        on = (top_k > 0) & (top_k < v)
        kth = ranked.gather(-1, (top_k.clamp(1, v) - 1).unsqueeze(-1))
        kept &= ~((masked < kth) & on.unsqueeze(-1))
    if top_p is not None:
        masked = z.masked_fill(~kept, float("-inf"))
        order = masked.argsort(-1, descending=True)
        prob = torch.softmax(masked, -1).gather(-1, order)
        above = prob.cumsum(-1) - prob  # the mass ranked strictly above each token
        keep_sorted = (above < top_p.to(z.dtype).unsqueeze(-1)) | (top_p >= 1).unsqueeze(-1)
        keep_sorted[:, 0] = True
        kept &= torch.zeros_like(kept).scatter_(-1, order, keep_sorted)
    return kept


def sampled_logits(hidden, weight, bias, softcap, temperature) -> torch.Tensor:
    """The final logits the sampler sees, materialized: softcap(h·Wᵀ + b) / τ `[N, V]` (τ a float or `[N]`), the
    GEMM in the weight's dtype, the rest in float64 for float64 hidden states, else float32."""
    compute = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    x = hidden.to(weight.dtype) @ weight.T
    if bias is not None:
        x = x + bias
    x = x.to(compute)
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    tau = temperature.to(compute).unsqueeze(-1) if isinstance(temperature, torch.Tensor) else temperature
    return x / tau


def sampled_logprobs_reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    temperature: float | torch.Tensor = 1.0,
    softcap: float | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
    ignore_index: int = -100,
    return_topk: int | None = None,
) -> dict:
    """Log-probs and entropy of the distribution vLLM samples from, on materialized `[N, V]` logits.

    z = softcap(h·Wᵀ + b) / τ (τ a float or `[N]`), the kept set S by vLLM's min-p, top-k, top-p (per-row `[N]`
    tensors or None), logp = z_y − log Σ_S exp z, H the entropy of softmax over S (docs/math.md §8). Float64
    for float64 inputs, else float32; differentiable by autograd with S held fixed.

    Returns: {"logp", "entropy", "kept" `[N, V]`, and with return_topk "topk_ids", "topk_logprobs"}.
    """
    z = sampled_logits(hidden, weight, bias, softcap, temperature)
    with torch.no_grad():
        kept = _vllm_kept(z.detach(), top_k, top_p, min_p)
    z_s = z.masked_fill(~kept, float("-inf"))
    lse = torch.logsumexp(z_s, -1)
    valid = targets != ignore_index
    safe = torch.where(valid, targets, torch.zeros_like(targets))
    logp = torch.where(valid, z.gather(-1, safe.unsqueeze(-1)).squeeze(-1) - lse, 0.0)
    p = torch.exp(z_s - lse.unsqueeze(-1))
    entropy = torch.where(valid, lse - (p * z.masked_fill(~kept, 0.0)).sum(-1), 0.0)
    out = {"logp": logp, "entropy": entropy, "kept": kept}
    if return_topk:
        with torch.no_grad():
            vals, ids = z.detach().topk(return_topk, -1)
            lp = (vals - lse.detach().unsqueeze(-1)).masked_fill(~kept.gather(-1, ids), float("-inf"))
        out["topk_ids"], out["topk_logprobs"] = ids, lp
    return out
