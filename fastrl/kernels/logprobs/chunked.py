"""Chunked pure-PyTorch token log-probs: the same memory bound as the kernels, on any device.

Forward walks the tokens in chunks, builds one `[C, V]` logit tile at a time and keeps only the
O(N) statistics (logp, entropy, and each row's logsumexp as its max and log Σ exp(z − max), kept apart:
log p = (z − max) − log Σ is then exact to the precision of log p, not to an ulp of a large logit, which the
entropy gradient at small H needs). Backward walks the vocabulary in `[N, V_chunk]` tiles, recomputed from
hidden, weight and those two statistics, and forms d_weight, d_bias and (accumulated in
float32) d_hidden. Tiles stay near `FASTRL_CHUNK_BYTES` (default 32 MiB). The math is docs/math.md §1;
the autograd Function that runs these two passes is in function.py.
"""

import os

import torch

from .params import LogprobParams

__all__ = ["chunk_cols", "chunk_rows", "chunked_backward", "chunked_forward", "no_autocast"]

_DEFAULT_CHUNK_BYTES = 32 * 2**20


def chunk_rows(vocab: int) -> int:
    """Rows per chunk so that one float32 `[rows, vocab]` tile is about FASTRL_CHUNK_BYTES."""
    budget = int(os.environ.get("FASTRL_CHUNK_BYTES", _DEFAULT_CHUNK_BYTES))
    return max(16, budget // (4 * vocab))


def no_autocast(hidden):
    # The tiles run in the inputs' dtype, as the Triton kernels do. Under autocast the forward would
    # use bf16 logits and the backward (usually outside the context) fp32 ones: p = exp(z − lse)
    # would then not sum to 1 and the gradient would be wrong.
    return torch.autocast(hidden.device.type, enabled=False)


def _live_rows(hidden, valid, sl):
    # Ignored rows are often padding whose hidden state may be inf/NaN: zero them (a [C, D] copy, small
    # next to the [C, V] tile) so no 0·NaN reaches the gradients, d_weight included.
    # It is also a contiguous copy whatever the input's layout, so forward and backward take the same
    # matmul and their tiles agree (a strided view once gave a backward tile off by an ulp of the logits).
    return torch.where(valid[sl].unsqueeze(-1), hidden[sl], 0.0)


def _finite_log_p(z):
    # log p = −inf (a −inf bias bans the token) has p = 0: p·log p is 0, but 0·(−inf) is NaN
    return z.clamp_(min=torch.finfo(z.dtype).min)


def _tile(hidden, weight, bias, temperature):
    # [C, V] float32 logits / temperature; the matmul runs in the input dtype, as eager does
    z = hidden @ weight.T if bias is None else torch.addmm(bias, hidden, weight.T)
    z = z.float()
    return z if temperature == 1.0 else z.div_(temperature)


def chunked_forward(hidden, weight, targets, bias, params: LogprobParams):
    """`[N, D]`, `[V, D]`, `[N]`, `[V]`|None → (logp `[N]`, entropy `[N]`|None, lse `[2, N]`), float32.

    lse[0] is each row's max logit, lse[1] its log Σ exp(z − max); their sum is the logsumexp.
    """
    n = hidden.shape[0]
    valid = targets != params.ignore_index
    safe = torch.where(valid, targets, torch.zeros_like(targets))
    logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
    lse = torch.empty(2, n, dtype=torch.float32, device=hidden.device)
    entropy = torch.empty(n, dtype=torch.float32, device=hidden.device) if params.return_entropy else None
    rows = chunk_rows(weight.shape[0])
    for start in range(0, n, rows):
        sl = slice(start, min(n, start + rows))
        z = _tile(_live_rows(hidden, valid, sl), weight, bias, params.temperature)
        c_max = z.amax(-1, keepdim=True)
        z.sub_(c_max)  # z − max: exact where it matters, at the largest logits
        c_log_sum = z.exp().sum(-1, keepdim=True).log_()
        lse[0, sl], lse[1, sl] = c_max.squeeze(-1), c_log_sum.squeeze(-1)
        logp[sl] = z.gather(-1, safe[sl].unsqueeze(-1)).squeeze(-1) - lse[1, sl]
        if entropy is not None:
            _finite_log_p(z.sub_(c_log_sum))  # z is now log p
            entropy[sl] = -z.exp().mul_(z).sum(-1)
    zero = torch.zeros((), dtype=torch.float32, device=hidden.device)
    logp = torch.where(valid, logp, zero)
    if entropy is not None:
        entropy = torch.where(valid, entropy, zero)
    return logp, entropy, lse


def chunk_cols(tokens: int) -> int:
    """Vocab columns per backward chunk so that one float32 `[tokens, cols]` tile is about FASTRL_CHUNK_BYTES."""
    budget = int(os.environ.get("FASTRL_CHUNK_BYTES", _DEFAULT_CHUNK_BYTES))
    return max(64, budget // (4 * max(tokens, 1)))


def chunked_backward(hidden, weight, targets, bias, lse, entropy, grad_logp, grad_entropy, params, needs):
    """(d_hidden, d_weight, d_bias), each None unless `needs` (hidden, weight, targets, bias) asks for it."""
    # Walks the vocabulary, not the tokens: each `[N, V_chunk]` tile gives its rows of d_weight complete
    # in one GEMM (inner dim N), and d_hidden `[N, D]` takes the running sum. Token chunks would instead
    # read and write the whole `[V, D]` d_weight once per chunk, which costs more whenever N < V.
    n, v, tau = hidden.shape[0], weight.shape[0], params.temperature
    valid = targets != params.ignore_index
    safe = torch.where(valid, targets, torch.zeros_like(targets))
    g = torch.where(valid, grad_logp.float(), 0.0) if grad_logp is not None else None
    e = torch.where(valid, grad_entropy.float(), 0.0) if grad_entropy is not None else None
    h = _live_rows(hidden, valid, slice(None))  # the forward's tile input, bit for bit
    h32 = h.float() if needs[1] else None
    d_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if needs[0] else None
    d_weight = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device) if needs[1] else None
    d_bias = torch.empty(v, dtype=torch.float32, device=weight.device) if needs[3] else None
    if g is not None:
        hit_order = torch.argsort(safe)  # rows sorted by target id, to find each chunk's targets fast
        hit_ids = safe[hit_order]
    cols = chunk_cols(n)
    for start in range(0, v, cols):
        sl = slice(start, min(v, start + cols))
        z = _tile(h, weight[sl], None if bias is None else bias[sl], tau)
        z.sub_(lse[0].unsqueeze(-1)).sub_(lse[1].unsqueeze(-1))  # log p, in the forward's order
        if e is not None:
            # z − Σ_u p z = log p + H; the entropy term is −e·p·(log p + H)
            p = _finite_log_p(z).exp()
            dz = z.add_(entropy.unsqueeze(-1)).mul_(p).mul_(-e.unsqueeze(-1))
            if g is not None:
                dz.addcmul_(p, g.unsqueeze(-1), value=-1.0)
            del p
        elif g is not None:
            dz = z.exp_().mul_(-g.unsqueeze(-1))
        else:
            dz = z.zero_()
        if g is not None:
            lo, hi = torch.searchsorted(hit_ids, torch.tensor([sl.start, sl.stop], device=hit_ids.device)).tolist()
            rows = hit_order[lo:hi]
            dz.index_put_((rows, safe[rows] - sl.start), g[rows], accumulate=True)
        if tau != 1.0:
            dz.div_(tau)
        if d_bias is not None:
            d_bias[sl] = dz.sum(0)
        if d_weight is not None:
            d_weight[sl] = dz.T @ h32
        if d_hidden is not None:
            d_hidden.addmm_(dz, weight[sl].float())
    return (
        None if d_hidden is None else d_hidden.to(hidden.dtype),
        d_weight,
        None if d_bias is None else d_bias.to(bias.dtype),
    )
