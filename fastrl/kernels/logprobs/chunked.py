"""Chunked pure-PyTorch token log-probs: the same memory bound as the kernels, on any device.

Forward walks the tokens in chunks, builds one `[C, V]` logit tile at a time and keeps only the
O(N) statistics (logp, entropy, and each row's logsumexp as its max and log Σ exp(z − max), kept apart:
log p = (z − max) − log Σ is then exact to the precision of log p, not to an ulp of a large logit, which the
entropy gradient at small H needs). A float32 CPU forward without the entropy builds vocab_major.py's
`[V, C]` tile instead, each row shifted by its target logit, which keeps that property. Backward walks the
vocabulary in `[N, V_chunk]` tiles, recomputed from hidden, weight and those two statistics, and forms
d_weight, d_bias and (accumulated in float32) d_hidden; when only logp carries a gradient (float32), the
per-row factors of ∂z move onto the GEMMs' `[N, D]` operands so a tile takes two elementwise passes. Ignored
rows are left out of every tile. Tiles stay near `FASTRL_CHUNK_BYTES` (default: 1/8 of the full logits,
within 32–128 MiB). The math is docs/math.md §1; the autograd Function that runs these two passes, and the
plain path of a checked call on it, close the module.
"""

import torch

from ..autograd import differentiable_once
from ..budgets import CHUNK_MAX_BYTES, CHUNK_MIN_BYTES, chunk_budget
from ..logits import divide_rows, logit_tile, no_autocast
from .params import LogprobParams, SampledLogprobs
from .vocab_major import shifted_exp_t, tile_t, vocab_major_rows

__all__ = [
    "ChunkedLogprobFunction",
    "needs_grad",
    "plain_torch_path",
    "token_logprobs_chunked",
    "chunk_bytes",
    "chunk_cols",
    "chunk_rows",
    "chunked_backward",
    "chunked_forward",
    "add_target_hits",
    "live_index",
    "live_rows_backward",
    "slab_grads",
]


def chunk_bytes(tokens: int | None = None, vocab: int | None = None) -> int:
    """The float32 tile budget: FASTRL_CHUNK_BYTES if set, else 1/8 of the full `[tokens, vocab]` logits within
    [CHUNK_MIN_BYTES, CHUNK_MAX_BYTES] (configs.py)."""
    budget = chunk_budget()
    if budget is not None:
        return budget
    if tokens is None or vocab is None:
        return CHUNK_MIN_BYTES
    return min(CHUNK_MAX_BYTES, max(CHUNK_MIN_BYTES, 4 * tokens * vocab // 8))


def chunk_rows(vocab: int, tokens: int | None = None) -> int:
    """Rows per chunk so that one float32 `[rows, vocab]` tile is about the chunk budget."""
    return max(16, chunk_bytes(tokens, vocab) // (4 * vocab))


def _finite_log_p(z):
    # log p = −inf (a −inf bias bans the token) has p = 0: p·log p is 0, but 0·(−inf) is NaN
    return z.clamp_(min=torch.finfo(z.dtype).min)


def chunked_forward(hidden, weight, targets, bias, params: LogprobParams):
    """`[N, D]`, `[V, D]`, `[N]`, `[V]`|None → (logp `[N]`, entropy `[N]`|None, lse `[2, N]`), float32.

    lse[0] is each row's shift (its max logit; its target logit on the float32 CPU path without the entropy,
    unless that row's sum overflowed), lse[1] its log Σ exp(z − shift); their sum is the logsumexp. Ignored
    rows are left out of the tiles (their hidden state is never read) and get logp = entropy = lse = 0.
    """
    n, v, dev = hidden.shape[0], weight.shape[0], hidden.device
    live = live_index(targets, params.ignore_index)
    logp = torch.zeros(n, dtype=torch.float32, device=dev)
    lse = torch.zeros(2, n, dtype=torch.float32, device=dev)
    entropy = torch.zeros(n, dtype=torch.float32, device=dev) if params.return_entropy else None
    n_live = n if live is None else live.numel()
    # batch invariance: the caller's block of a fixed row count is one tile (invariant.py)
    rows = max(1, n_live) if params.batch_invariant else chunk_rows(v, n_live)
    if entropy is None and dev.type == "cpu" and hidden.dtype == weight.dtype == torch.float32:
        _vocab_major_forward(hidden, weight, targets, bias, params.temperature, live, rows, (logp, lse))
        return logp, entropy, lse
    tile = torch.empty(min(rows, n_live), v, dtype=torch.float32, device=dev)
    for start in range(0, n_live, rows):
        stop = min(n_live, start + rows)
        idx = slice(start, stop) if live is None else live[start:stop]
        x = hidden[idx].contiguous()  # the backward's rows, bit for bit, whatever the input's layout
        z = logit_tile(x, weight, bias, tau=params.temperature, out=tile[: stop - start])
        c_max = z.amax(-1, keepdim=True)
        z.sub_(c_max)  # z − max: exact where it matters, at the largest logits
        target_z = z.gather(-1, targets[idx].unsqueeze(-1)).squeeze(-1)
        # without the entropy, z − max is not needed again: exp in place
        c_log_sum = (z.exp() if entropy is not None else z.exp_()).sum(-1, keepdim=True).log_()
        lse[0, idx], lse[1, idx] = c_max.squeeze(-1), c_log_sum.squeeze(-1)
        logp[idx] = target_z - c_log_sum.squeeze(-1)
        if entropy is not None:
            _finite_log_p(z.sub_(c_log_sum))  # z is now log p
            entropy[idx] = -z.exp().mul_(z).sum(-1)
    return logp, entropy, lse


def _vocab_major_forward(hidden, weight, targets, bias, tau, live, rows, out):
    # float32 on the CPU without the entropy: vocab_major.py's tile, shifted by the target logit (lse[0] then
    # holds that shift, lse[1] log Σ exp(z − shift): the backward needs only their roles, not the max), into
    # out = (logp, lse)
    logp, lse = out
    n_live = hidden.shape[0] if live is None else live.numel()
    rows = vocab_major_rows(rows)
    tile = tile_t(weight.shape[0], min(rows, n_live), hidden.device)
    for start in range(0, n_live, rows):
        stop = min(n_live, start + rows)
        idx = slice(start, stop) if live is None else live[start:stop]
        x, y = hidden[idx].contiguous(), targets[idx]
        e = logit_tile(x, weight, bias, tau=tau, out=tile[:, : stop - start], vocab_major=True)
        z_y, shift, s = shifted_exp_t(e, x, weight, bias, tau, y)
        log_s = s.log_()
        lse[0, idx], lse[1, idx] = shift, log_s
        logp[idx] = z_y.sub_(shift).sub_(log_s)


def live_index(targets, ignore_index):
    """The rows to compute, or None when every row is live (then no gather is needed)."""
    valid = targets != ignore_index
    if bool(valid.all()):
        return None
    return torch.nonzero(valid).squeeze(-1)


def live_rows_backward(backward, live, hidden, weight, targets, bias, *row_args):
    """`backward(hidden, weight, targets, bias, *row_args)` of the `live` rows only (each tensor in row_args, or in
    a tuple of them, taken at those rows along its last dim; other values as they are), d_hidden put back in
    place with zeros for the other rows. Returns (d_hidden, d_weight, d_bias)."""

    def pick(t):
        if isinstance(t, tuple):
            return tuple(pick(x) for x in t)
        return t.index_select(-1, live) if isinstance(t, torch.Tensor) else t

    d_hidden, d_weight, d_bias = backward(
        hidden.index_select(0, live), weight, targets.index_select(0, live), bias, *(pick(a) for a in row_args)
    )
    if d_hidden is not None:
        d_hidden = torch.zeros_like(hidden).index_copy_(0, live, d_hidden)
    return d_hidden, d_weight, d_bias


def chunk_cols(tokens: int, vocab: int | None = None) -> int:
    """Vocab columns per backward chunk so that one float32 `[tokens, cols]` tile is about the chunk budget."""
    return max(64, chunk_bytes(tokens, vocab) // (4 * max(tokens, 1)))


def chunked_backward(hidden, weight, targets, bias, saved, grads, params, needs):
    """(d_hidden, d_weight, d_bias), each None unless `needs` (hidden, weight, targets, bias) asks for it; `saved` is
    the forward's (lse `[2, N]`, entropy `[N]` or None), `grads` the upstream (∂/∂logp, ∂/∂entropy), each or None.

    Ignored rows are left out (they get a zero d_hidden); a target ≥ V (vocab-parallel: another rank's
    token) contributes its row's softmax gradient but no one-hot term.
    """
    live = live_index(targets, params.ignore_index)
    if live is not None:  # the live rows only, then d_hidden back in place
        row_args = (saved, grads, params, needs)
        return live_rows_backward(chunked_backward, live, hidden, weight, targets, bias, *row_args)
    (lse, entropy), (grad_logp, grad_entropy) = saved, grads
    # Walks the vocabulary, not the tokens: each `[N, V_chunk]` tile gives its rows of d_weight complete
    # in one GEMM (inner dim N), and d_hidden `[N, D]` takes the running sum. Token chunks would instead
    # read and write the whole `[V, D]` d_weight once per chunk, which costs more whenever N < V.
    n, v, tau = hidden.shape[0], weight.shape[0], params.temperature
    g = grad_logp.float() if grad_logp is not None else None
    e = grad_entropy.float() if grad_entropy is not None else None
    h = hidden.contiguous()  # the forward's tile input, bit for bit
    d_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if needs[0] else None
    d_weight = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device) if needs[1] else None
    d_bias = torch.empty(v, dtype=torch.float32, device=weight.device) if needs[3] else None
    if e is None and g is not None and weight.dtype == torch.float32:
        # (half-precision weights keep the general path: its d_weight slabs are rounded once, one-hot included)
        return _logp_only_backward(h, weight, bias, targets, lse, g, tau, (d_hidden, d_weight, d_bias))
    h32 = h.float() if needs[1] else None
    if g is not None:
        hit_order = torch.argsort(targets)  # rows sorted by target id, to find each chunk's targets fast
        hit_ids = targets[hit_order]
    cols = chunk_cols(n, v)
    for start in range(0, v, cols):
        sl = slice(start, min(v, start + cols))
        z = logit_tile(h, weight[sl], None if bias is None else bias[sl], tau=tau)
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
            add_target_hits(dz, sl, hit_order, hit_ids, targets, g)
        slab_grads(divide_rows(dz, tau), sl, h32, weight, d_hidden, d_weight, d_bias)
    return _finish(hidden, bias, d_hidden, d_weight, d_bias)


def add_target_hits(dz, sl, order, hits, targets, g) -> None:
    """The one-hot term of ∂z on a vocabulary slab `sl`: dz[n, y_n − sl.start] += g_n for the rows whose target
    falls in it (`order`: the rows sorted by target, `hits`: their sorted targets; a target ≥ V never does)."""
    lo, hi = torch.searchsorted(hits, torch.tensor([sl.start, sl.stop], device=hits.device)).tolist()
    rows = order[lo:hi]
    dz.index_put_((rows, targets[rows] - sl.start), g[rows], accumulate=True)


def slab_grads(dz, sl, h32, weight, d_hidden, d_weight, d_bias) -> None:
    """A vocabulary slab's share of the gradients from its float32 ∂z `[N, V_c]`: its rows of d_weight and d_bias
    (complete), and its term of the d_hidden sum; a None gradient is not wanted."""
    if d_bias is not None:
        d_bias[sl] = dz.sum(0)
    if d_weight is not None:
        d_weight[sl] = dz.T @ h32
    if d_hidden is not None:
        d_hidden.addmm_(dz, weight[sl].float())


def _finish(hidden, bias, d_hidden, d_weight, d_bias):
    return (
        None if d_hidden is None else d_hidden.to(hidden.dtype),
        d_weight,
        None if d_bias is None else d_bias.to(bias.dtype),
    )


def _logp_only_backward(h, weight, bias, targets, lse, g, tau, grads):
    """The float32 backward when only logp carries a gradient: ∂z = g·(onehot − p)/τ, p = e/s, e = exp(z − shift).

    The row factors g / (s·τ) move onto the GEMMs' `[N, D]` operands: d_weight = onehotᵀ·(g·h)/τ − eᵀ·(g·h/(s·τ)),
    d_hidden = g·(W[target] − (e·W)/s)/τ. A tile then takes two passes (− shift, exp) and no per-row scale; the
    shift is the forward's lse[0] (chunked_forward).
    """
    d_hidden, d_weight, d_bias = grads
    n, v = h.shape[0], weight.shape[0]
    shift, s = lse[0].unsqueeze(-1), lse[1].exp().unsqueeze(-1)
    g_tau = (g / tau).unsqueeze(-1)  # [N, 1]
    neg_scale = -g_tau / s  # [N, 1]: −g / (s·τ)
    hs = h * neg_scale if d_weight is not None else None  # [N, D]
    ew = torch.zeros(h.shape, dtype=torch.float32, device=h.device) if d_hidden is not None else None  # Σ_v e·W_v
    cols = chunk_cols(n, v)
    tile = torch.empty(n, min(cols, v), dtype=torch.float32, device=h.device)  # one buffer for every slab
    for start in range(0, v, cols):
        sl = slice(start, min(v, start + cols))
        buf = tile if sl.stop - sl.start == tile.shape[1] else torch.empty_like(tile[:, : sl.stop - sl.start])
        e = logit_tile(h, weight[sl], None if bias is None else bias[sl], tau=tau, out=buf).sub_(shift).exp_()
        if d_weight is not None:
            torch.mm(e.T, hs, out=d_weight[sl])
        if d_bias is not None:
            d_bias[sl] = (e.T @ neg_scale).squeeze(-1)
        if ew is not None:
            ew.addmm_(e, weight[sl])
    # the one-hot part: + g/τ at each row's target (none for a target on another vocab-parallel rank)
    hit = (targets < v).unsqueeze(-1)
    g_hit, safe = torch.where(hit, g_tau, 0.0), torch.where(hit.squeeze(-1), targets, 0)
    if d_weight is not None:
        d_weight.index_add_(0, safe, h * g_hit)
    if d_bias is not None:
        d_bias.index_add_(0, safe, g_hit.squeeze(-1))
    if d_hidden is not None:
        d_hidden = ew.mul_(neg_scale).add_(weight.index_select(0, safe) * g_hit)
    return _finish(h, bias, d_hidden, d_weight, d_bias)


def needs_grad(hidden, weight, bias) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))


class ChunkedLogprobFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, bias, params: LogprobParams):
        with no_autocast(hidden):
            logp, entropy, lse = chunked_forward(hidden, weight, targets, bias, params)
        ctx.params = params
        ctx.save_for_backward(hidden, weight, targets, bias, lse, entropy)
        return logp if entropy is None else (logp, entropy)

    @staticmethod
    @differentiable_once  # the backward is hand-written: a second derivative must raise, not be wrong
    def backward(ctx, grad_logp, *grad_rest):
        hidden, weight, targets, bias, lse, entropy = ctx.saved_tensors
        grad_entropy = grad_rest[0] if grad_rest else None
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], False, ctx.needs_input_grad[3])
        with no_autocast(hidden):
            d_hidden, d_weight, d_bias = chunked_backward(
                hidden, weight, targets, bias, (lse, entropy), (grad_logp, grad_entropy), ctx.params, needs
            )
        return d_hidden, d_weight, None, d_bias, None


def token_logprobs_chunked(hidden, weight, targets, bias, params: LogprobParams):
    """`[N, D]`, `[V, D]`, `[N]` → logp `[N]` (and entropy `[N]`), float32, memory O(N + chunk·V)."""
    if not needs_grad(hidden, weight, bias):
        with no_autocast(hidden):
            logp, entropy, _ = chunked_forward(hidden, weight, targets, bias, params)
        return logp, entropy
    out = ChunkedLogprobFunction.apply(hidden, weight, targets, bias, params)
    return (out, None) if isinstance(out, torch.Tensor) else out


def plain_torch_path(c) -> SampledLogprobs:
    """The plain path of a checked log-prob call (api.py's `_Call`) on the chunked walk."""
    hidden = c.hidden if c.hidden.dtype == c.weight.dtype else c.hidden.to(c.weight.dtype)  # an fp32 head
    logp, entropy = token_logprobs_chunked(hidden, c.weight, c.targets, c.bias, c.params)
    return SampledLogprobs(logp, entropy, None, None, None)
