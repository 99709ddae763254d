"""One walk over the tokens that yields the loss and every gradient (docs/math.md §7).

Per chunk of C live tokens: the `[C, V]` float32 logit tile (one GEMM), its fold into lse, logp and
entropy, the per-token loss derivatives ∂ℓ/∂logp and ∂ℓ/∂H from the policy op, ∂ℓ/∂z formed in the
tile in place, then d_hidden of the chunk (one GEMM, inner dim V, complete) and d_weight += ∂zᵀ·h (one
GEMM, accumulated in float32). 6·N·D·V FLOPs against the 8·N·D·V of a forward plus a recomputing
backward. Masked tokens are left out of the chunks altogether; asked for batch invariance, the last chunk is padded
to the full row count with zero rows, so no product's shape follows N. The fold runs as torch ops (impl
"torch") or as the two Triton kernels of epilogue.py (impl "triton"); the GEMMs are torch's either way.
"""

import torch

from ..budgets import FUSED_CPU_CHUNK_BYTES, FUSED_GPU_CHUNK_BYTES, FUSED_MIN_ROWS, chunk_budget
from ..logits import divide_rows, logit_tile
from ..logprobs.invariant import pad_rows
from .lean import lean_applies, lean_forward
from .params import FusedLossParams

__all__ = ["fused_rows", "fused_forward"]


def fused_rows(vocab: int, device: torch.device) -> int:
    """Tokens per chunk so that one float32 `[rows, vocab]` tile is about FASTRL_CHUNK_BYTES, or by default the
    device's budget (configs.py: 64 MiB on CPU, 2 GiB on a GPU), never under FUSED_MIN_ROWS rows."""
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


class _TorchFold:
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

    def dz(self, g, g_entropy):
        """∂ℓ/∂(h·Wᵀ) in place: (g·(onehot − p) − g_H·p·(log p + H)) / τ, with p = e / s."""
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


class _TritonFold:
    """The same fold and ∂z as two Triton kernels, each reading the tile once."""

    def __init__(self, z, targets, tau, entropy: bool):
        from .epilogue import fold_stats

        self.z, self.targets, self.tau = z, targets, tau
        self.row_max, self.log_sum, self.logp, self.entropy = fold_stats(z, targets, tau, entropy)

    def dz(self, g, g_entropy, out):
        from .epilogue import fold_dz

        fold_dz(self.z, out, self.targets, self.tau, self.row_max, self.log_sum, self.entropy, g, g_entropy)
        return out


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
    n, d = hidden.shape
    v = weight.shape[0]
    dev = hidden.device
    rows = fused_rows(v, dev)
    if lean_applies(hidden, weight, params):
        return lean_forward(hidden, weight, bias, targets, tau, token_grad, params, rows)
    live = torch.nonzero(targets >= 0).squeeze(-1)
    logp = torch.zeros(n, dtype=torch.float32, device=dev)
    entropy = torch.zeros(n, dtype=torch.float32, device=dev) if params.entropy else None
    need_h, need_w, need_b = params.needs
    d_hidden = torch.zeros(n, d, dtype=hidden.dtype, device=dev) if need_h else None
    d_weight = torch.zeros(v, d, dtype=torch.float32, device=dev) if need_w else None
    d_bias = torch.zeros(v, dtype=torch.float32, device=dev) if need_b else None
    # batch invariance: every tile, GEMM and row reduction of one shape, the last chunk padded with zero rows
    tile = torch.empty(rows if params.batch_invariant else min(rows, live.numel()), v, dtype=torch.float32, device=dev)
    low = hidden.dtype != torch.float32
    # the Triton epilogue writes ∂z straight in the GEMM dtype; the torch fold casts its float32 tile
    dz_buf = torch.empty(tile.shape, dtype=hidden.dtype, device=dev) if low and params.impl == "triton" else None
    fold_cls = _TritonFold if params.impl == "triton" else _TorchFold
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
        if params.impl == "triton":
            dz = fold.dz(g, g_entropy, z if dz_buf is None else dz_buf[: c + pad])
        else:
            dz = fold.dz(g, g_entropy)
        del fold
        if d_bias is not None:
            d_bias.add_(dz.sum(0, dtype=torch.float32))
        dz_mm = dz if dz.dtype == hidden.dtype else dz.to(hidden.dtype)
        if d_hidden is not None:
            d_hidden.index_copy_(0, idx, (dz_mm @ weight)[:c])
        if d_weight is not None:
            if low and not dz.is_cuda:
                _acc_fp32(d_weight, dz.T, h)  # CPU: float32 GEMM on the float32 ∂z
            else:
                _acc_fp32(d_weight, dz_mm.T, h)
    # In the inputs' dtypes now, so that what lives from forward to backward is one `[V, D]` gradient.
    if d_weight is not None and weight.dtype != torch.float32:
        d_weight = d_weight.to(weight.dtype)
    if d_bias is not None and bias.dtype != torch.float32:
        d_bias = d_bias.to(bias.dtype)
    return logp, entropy, (d_hidden, d_weight, d_bias)
