"""The gradient-in-forward op: log-probs and the gradients of a per-token loss from one walk over the tokens
(docs/math.md §7).

`fused_logprob_grads` takes the log-prob op's checked call (`logprob_call`) and any per-token loss (a `token_grad`
callback: `PolicyTokens` for the policy loss) and runs the walk here. Per chunk of C live tokens: the `[C, V]`
float32 logit tile (one GEMM), its fold into lse, logp and entropy (`TorchFold`, or epilogue.py's Triton kernels),
the per-token loss derivatives ∂ℓ/∂logp and ∂ℓ/∂H, ∂ℓ/∂z formed in the tile in place, then d_hidden of the chunk
(one GEMM, inner dim V, complete) and d_weight += ∂zᵀ·h (one GEMM, accumulated in float32). 6·N·D·V FLOPs against
the 8·N·D·V of a forward plus a recomputing backward. Masked tokens are left out of the chunks altogether; asked for
batch invariance, the last chunk is padded to the full row count with zero rows, so no product's shape follows N.

The float32 CPU walk (`lean_forward`, when the entropy takes no gradient) changes two things, none of the math: the
tile is vocab-major and shifted by the target logit (logprobs/vocab_major.py: the fastest GEMM layouts on the CPU,
no pass for the max), and ∂z = g·(onehot − e/s)/τ is never formed: the row factor −g/(s·τ) moves onto the `[C, D]`
operands, d_hidden = (eᵀ)ᵀ·W·(−g/(sτ)) + (g/τ)·W_y and d_weight += eᵀ·(h·(−g/(sτ))) + onehotᵀ·(h·g/τ). A tile
takes one exp pass and one sum besides the three GEMMs. An entropy metric comes from the d_hidden GEMM's product:
H = log s + shift − (h·Σ_v e_v W_v + Σ_v e_v b_v)/(τ·s).
"""

import torch

from ..budgets import FUSED_CPU_CHUNK_BYTES, FUSED_GPU_CHUNK_BYTES, FUSED_MIN_ROWS, chunk_budget
from ..logits import divide_rows, logit_tile, no_autocast
from ..logprobs.invariant import pad_rows
from ..logprobs.vocab_major import shifted_exp_t, tile_t, vocab_major_rows
from .params import FusedLossParams

__all__ = ["fused_forward", "fused_logprob_grads", "fused_rows", "lean_applies", "lean_forward"]


def fused_logprob_grads(call, token_grad, entropy_grad: bool = False):
    """Per-token logp (and entropy) and, from the same pass, the gradients of L = Σ ℓ(logp, H).

    Args:
        call: the log-prob op's checked call (`logprob_call`) over `[N]` rows, on the full softmax: no truncation,
            soft-cap, top-k export, kept sets or process group. Its `return_entropy` asks for the entropy.
        token_grad: `(flat rows [C], logp [C], entropy [C] | None) → (∂L/∂logp [C], ∂L/∂H [C] | None)`,
            called once per chunk of live tokens, in order.
        entropy_grad: whether token_grad may return ∂L/∂H (the entropy is then computed whatever `return_entropy`
            says). False lets the float32 CPU walk form an entropy metric from its d_hidden GEMM; a ∂L/∂H raises.

    Returns:
        logp `[N]`, entropy `[N]` or None (float32, detached), and (d_hidden `[N, D]`, d_weight, d_bias): ∂L/∂hidden,
        ∂L/∂weight, ∂L/∂bias in the inputs' dtypes, None where the input needs no gradient.
    """
    p = call.params
    if call.trunc is not None or p.softcap is not None or call.return_topk is not None or call.kept is not None:
        raise ValueError("the gradient-in-forward pass takes the full softmax: no truncation, soft-cap or top-k")
    if call.group is not None:
        raise ValueError("the gradient-in-forward pass takes the whole head: no process_group")
    needs = tuple(t is not None and t.requires_grad for t in (call.hidden, call.weight, call.bias))
    params = FusedLossParams(call.impl, p.return_entropy or entropy_grad, needs, entropy_grad, p.batch_invariant)
    targets = torch.where(call.targets == p.ignore_index, -1, call.targets.long())
    hidden, weight, bias = (None if t is None else t.detach() for t in (call.hidden, call.weight, call.bias))
    with torch.no_grad(), no_autocast(hidden):
        return fused_forward(hidden, weight, bias, targets, p.temperature, token_grad, params)


def fused_rows(vocab: int, device: torch.device) -> int:
    """Tokens per chunk so that one float32 `[rows, vocab]` tile is about FASTRL_CHUNK_BYTES, or by default the
    device's budget (budgets.py: 64 MiB on CPU, 2 GiB on a GPU), never under FUSED_MIN_ROWS rows."""
    default = FUSED_CPU_CHUNK_BYTES if device.type == "cpu" else FUSED_GPU_CHUNK_BYTES
    budget = chunk_budget()
    rows = max(16, budget // (4 * vocab)) if budget else max(FUSED_MIN_ROWS, default // (4 * vocab))
    return rows if device.type == "cpu" or rows < 256 else rows // 128 * 128


def _acc_fp32(acc, a, b):
    # acc += a @ b, float32 accumulation across chunks
    if a.dtype == torch.float32 and b.dtype == torch.float32:
        acc.addmm_(a, b)
    elif a.is_cuda and a.dtype == b.dtype and a.dtype in (torch.float16, torch.bfloat16):
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc.addmm_(a.float(), b.float())


def _outputs(n, hidden, weight, params: FusedLossParams, hidden_dtype):
    # logp, entropy and the float32 accumulators (d_hidden in hidden_dtype) the walks fill, zero where not live
    dev, (v, d) = hidden.device, weight.shape
    need_h, need_w, need_b = params.needs
    logp = torch.zeros(n, dtype=torch.float32, device=dev)
    entropy = torch.zeros(n, dtype=torch.float32, device=dev) if params.entropy else None
    d_hidden = torch.zeros(n, d, dtype=hidden_dtype, device=dev) if need_h else None
    d_weight = torch.zeros(v, d, dtype=torch.float32, device=dev) if need_w else None
    d_bias = torch.zeros(v, dtype=torch.float32, device=dev) if need_b else None
    return logp, entropy, (d_hidden, d_weight, d_bias)


class TorchFold:
    """The fold and ∂z of one tile as torch ops; z holds the scaled logits minus their row max after fold."""

    def __init__(self, z, targets, tau, entropy: bool):
        divide_rows(z, tau)
        z.sub_(z.amax(-1, keepdim=True))
        self.z, self.targets, self.tau = z, targets.unsqueeze(-1), tau
        target_z = z.gather(-1, self.targets).squeeze(-1)
        # e = exp(z − max): a second buffer only when the entropy needs z − max as well
        self.e = torch.exp(z) if entropy else z.exp_()
        self.s = self.e.sum(-1)
        self.log_s = self.s.log()
        self.logp = target_z - self.log_s
        self.entropy = None
        if entropy:
            e_dot_z = torch.bmm(self.e.unsqueeze(1), z.unsqueeze(2)).reshape(-1)  # Σ_v e·(z − max)
            self.entropy = self.log_s - e_dot_z / self.s

    def dz(self, g, g_entropy, out=None):
        """∂ℓ/∂(h·Wᵀ) in place: (g·(onehot − p) − g_H·p·(log p + H)) / τ, with p = e / s (`out` unused)."""
        if g_entropy is not None:
            # z − max − log s + H = log p + H
            dz = self.z.add_((self.entropy - self.log_s).unsqueeze(-1)).mul_(self.e)
            dz.mul_((-g_entropy / self.s).unsqueeze(-1)).addcmul_(self.e, (-g / self.s).unsqueeze(-1))
        else:
            dz = self.e.mul_((-g / self.s).unsqueeze(-1))
        self.e = None
        dz.scatter_add_(-1, self.targets, g.unsqueeze(-1))
        divide_rows(dz, self.tau)
        return dz


def fused_forward(hidden, weight, bias, targets, tau, token_grad, params: FusedLossParams):
    """Per-token logp / entropy of the live tokens and the gradients of Σ ℓ w.r.t. hidden, weight, bias.

    Args:
        hidden: `[N, D]`; weight: `[V, D]`; bias: `[V]` or None; targets: `[N]` int64, < 0 = not live
            (left out: its hidden row is never read, its logp, entropy and d_hidden are 0).
        tau: the temperature, a float or a `[N]` float32 tensor.
        token_grad: `(rows [C], logp [C], entropy [C] | None) → (∂L/∂logp [C], ∂L/∂H [C] | None)`.
        params: impl, whether the entropy is computed and whether the loss depends on it, `needs`.

    Returns:
        logp `[N]`, entropy `[N]` | None (float32), and (d_hidden, d_weight, d_bias) in the inputs'
        dtypes, each None unless `params.needs` asks for it.
    """
    rows = fused_rows(weight.shape[0], hidden.device)
    if lean_applies(hidden, weight, params):
        return lean_forward(hidden, weight, bias, targets, tau, token_grad, params, rows)
    live = torch.nonzero(targets >= 0).squeeze(-1)
    logp, entropy, (d_hidden, d_weight, d_bias) = _outputs(hidden.shape[0], hidden, weight, params, hidden.dtype)
    # batch invariance: every tile, GEMM and row reduction of one shape, the last chunk padded with zero rows
    tile_rows = rows if params.batch_invariant else min(rows, live.numel())
    tile = torch.empty(tile_rows, weight.shape[0], dtype=torch.float32, device=hidden.device)
    low = hidden.dtype != torch.float32
    # the Triton epilogue writes ∂z straight in the GEMM dtype; the torch fold casts its float32 tile
    dz_buf = None
    if low and params.impl == "triton":
        dz_buf = torch.empty(tile.shape, dtype=hidden.dtype, device=hidden.device)
    fold_cls = TorchFold
    if params.impl == "triton":
        from .epilogue import TritonFold as fold_cls  # imports triton: only when this path runs
    for start in range(0, live.numel(), rows):
        idx = live[start : start + rows]
        c = idx.numel()
        pad = tile.shape[0] - c if params.batch_invariant else 0
        h = pad_rows(hidden.index_select(0, idx), pad, 0.0)
        z = tile[: c + pad]
        logit_tile(h, weight, bias, out=z, fp32_product=True)  # z / τ is the fold's first step
        tau_c = pad_rows(tau.index_select(0, idx), pad, 1.0) if isinstance(tau, torch.Tensor) else tau
        fold = fold_cls(z, pad_rows(targets.index_select(0, idx), pad, 0), tau_c, params.entropy)
        logp.index_copy_(0, idx, fold.logp[:c])
        if entropy is not None:
            entropy.index_copy_(0, idx, fold.entropy[:c])
        g, g_entropy = token_grad(idx, fold.logp[:c], None if fold.entropy is None else fold.entropy[:c])
        g, g_entropy = pad_rows(g, pad, 0.0), None if g_entropy is None else pad_rows(g_entropy, pad, 0.0)
        dz = fold.dz(g, g_entropy, z if dz_buf is None else dz_buf[: c + pad])
        del fold
        if d_bias is not None:
            d_bias.add_(dz.sum(0, dtype=torch.float32))
        dz_mm = dz if dz.dtype == hidden.dtype else dz.to(hidden.dtype)
        if d_hidden is not None:
            d_hidden.index_copy_(0, idx, (dz_mm @ weight)[:c])
        if d_weight is not None:
            # CPU: a float32 GEMM on the float32 ∂z
            _acc_fp32(d_weight, dz.T if low and not dz.is_cuda else dz_mm.T, h)
    # In the inputs' dtypes now, so that what lives from forward to backward is one `[V, D]` gradient.
    if d_weight is not None and weight.dtype != torch.float32:
        d_weight = d_weight.to(weight.dtype)
    if d_bias is not None and bias.dtype != torch.float32:
        d_bias = d_bias.to(bias.dtype)
    return logp, entropy, (d_hidden, d_weight, d_bias)


def lean_applies(hidden: torch.Tensor, weight: torch.Tensor, params: FusedLossParams) -> bool:
    """The lean walk serves float32 torch-impl calls on the CPU whose loss takes no gradient through the entropy
    (an entropy metric comes from the d_hidden GEMM's product, so that gradient must be wanted then)."""
    entropy_ok = not params.entropy or (not params.entropy_grad and params.needs[0])
    return (
        params.impl == "torch"
        and entropy_ok
        and hidden.device.type == "cpu"
        and hidden.dtype == weight.dtype == torch.float32
    )


def _entropy(s, shift, h, ew, e, bias, tau):
    # H = log s + shift − E_p[z], E_p[z] = (h·Σ_v e_v W_v + Σ_v e_v b_v) / (τ·s): the d_hidden GEMM's product.
    # Exact in exact arithmetic; in float32 off by a few ulps of the logits (a metric, never differentiated)
    mean_z = (h * ew).sum(-1)
    if bias is not None:
        mean_z += torch.mv(e.T, bias)
    return (s.log() + shift - mean_z.div_(s).div_(tau)).clamp_(min=0.0)


def lean_forward(hidden, weight, bias, targets, tau, token_grad, params: FusedLossParams, rows: int):
    """fused_forward's contract (entropy None), on `rows`-token vocab-major tiles; see the module docstring."""
    live = torch.nonzero(targets >= 0).squeeze(-1)
    logp, entropy, (d_hidden, d_weight, d_bias) = _outputs(hidden.shape[0], hidden, weight, params, torch.float32)
    rows = vocab_major_rows(rows)
    # batch invariance: every tile and GEMM of one shape, the last chunk padded with zero rows (as fused_forward)
    tile = tile_t(weight.shape[0], rows if params.batch_invariant else min(rows, live.numel()), hidden.device)
    for start in range(0, live.numel(), rows):
        idx = live[start : start + rows]
        c = idx.numel()
        pad = tile.shape[1] - c if params.batch_invariant else 0
        h, y = pad_rows(hidden.index_select(0, idx), pad, 0.0), pad_rows(targets.index_select(0, idx), pad, 0)
        tau_c = pad_rows(tau.index_select(0, idx), pad, 1.0) if isinstance(tau, torch.Tensor) else tau
        e = logit_tile(h, weight, bias, tau=tau_c, out=tile[:, : c + pad], vocab_major=True)
        z_y, shift, s = shifted_exp_t(e, h, weight, bias, tau_c, y)
        logp_c = z_y - shift - s.log()
        logp.index_copy_(0, idx, logp_c[:c])
        ew = torch.mm(e.T, weight) if d_hidden is not None else None  # Σ_v e_v W_v, [C, D]
        h_c = None
        if entropy is not None:
            h_c = _entropy(s, shift, h, ew, e, bias, tau_c)
            entropy.index_copy_(0, idx, h_c[:c])
        g, g_entropy = token_grad(idx, logp_c[:c], None if h_c is None else h_c[:c])
        if g_entropy is not None:
            raise RuntimeError("lean_forward: token_grad returned ∂L/∂H for a loss declared without entropy gradient")
        g = pad_rows(g, pad, 0.0)
        g_tau = (g / tau_c).unsqueeze(-1)  # ∂L/∂z = g_tau·(onehot − e/s)
        neg = -g_tau / s.unsqueeze(-1)
        if d_hidden is not None:
            d_hidden.index_copy_(0, idx, ew.mul_(neg).add_(weight.index_select(0, y) * g_tau)[:c])
        if d_weight is not None:
            d_weight.addmm_(e, h * neg).index_add_(0, y, h * g_tau)
        if d_bias is not None:
            d_bias.addmv_(e, neg.squeeze(-1)).index_add_(0, y, g_tau.squeeze(-1))
    return logp, entropy, (d_hidden, d_weight, d_bias)
