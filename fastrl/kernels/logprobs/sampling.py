"""The sampler's kept set: min-p, top-k and top-p as one threshold per row (docs/math.md §8).

vLLM's sampler keeps, per row, an upper set of the final logits z (soft-capped, then divided by the
temperature): min-p, then top-k, then top-p, each on what the previous one left. Every rule keeps all tokens
above some value, so the kept set is S = {v : z_v ≥ θ} for one float32 θ per row. θ is placed midway between
the smallest kept logit and the largest dropped one, so a recompute of z in another chunking never moves a
token across it. The search runs on one in-memory `[C, V]` tile: a max for min-p, `torch.topk` for top-k, and
for top-p a few histogram passes on the logit value that narrow the window holding the boundary token until
at most `_EXACT` candidates are left, which are then ranked exactly.
"""

import numbers
from typing import NamedTuple

import torch

__all__ = ["Truncation", "Workspace", "rule_on", "sampler_on", "tile_threshold", "truncation"]

_BINS = 1024  # histogram bins per top-p pass
_EXACT = 1024  # candidates ranked exactly (one topk) once the window holds at most this many
_PASSES = 4  # 2^-40 of the window: what is still together after that is treated as tied
_RANGE = 104.0  # exp(z − max) is 0 in float32 below max − 104: those tokens share the lowest bin
_MIN_WIDTH = 1e-30  # the narrowest window a pass bins: _BINS / it stays a finite float32


class Truncation(NamedTuple):
    """Per-row sampler settings, `[N]` tensors; None = that rule is off on every row."""

    top_k: torch.Tensor | None  # int64; k ≤ 0 or k ≥ V: off on that row
    top_p: torch.Tensor | None  # float32 in (0, 1]; 1: off
    min_p: torch.Tensor | None  # float32 in [0, 1]; 0: off

    def rows(self, idx) -> "Truncation":
        return Truncation(*(None if t is None else t[idx] for t in self))


def _rows_of(name, value, shape, device, integer: bool):
    """A scalar or a `[B]` / targets-shaped tensor → `[N]` (None when the value is None)."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        ok = not value.is_complex() and value.dtype != torch.bool
        ok = ok and (not value.is_floating_point() if integer else value.is_floating_point())
        if not ok:
            raise TypeError(f"{name} must be {'an integer' if integer else 'a floating'} tensor, got {value.dtype}")
        if value.device != device:
            raise ValueError(f"{name} must be on {device}, got {value.device}")
        if tuple(value.shape) == tuple(shape[:1]) and len(shape) > 1:
            value = value.reshape(-1, *([1] * (len(shape) - 1))).expand(shape)
        elif tuple(value.shape) != tuple(shape):
            raise ValueError(
                f"{name} must be a number, a [B] = {tuple(shape[:1])} or a {tuple(shape)} tensor, got "
                f"{tuple(value.shape)}"
            )
        return value.reshape(-1).to(torch.int64 if integer else torch.float32)
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} must be {'an int' if integer else 'a float'} or a tensor, got {value!r}")
    n = 1
    for s in shape:
        n *= s
    return torch.full((n,), value, dtype=torch.int64 if integer else torch.float32, device=device)


def rule_on(name: str, value, vocab: int | None = None) -> bool:
    """Whether one sampler rule may drop a token: None, `top_k <= 0` (or `>= vocab` when it is known),
    `top_p == 1` and `min_p == 0` are off; a tensor counts as on (its rows are judged one by one later), and so
    does a value of the wrong type or range (the checks of `truncation` then name it)."""
    if value is None or isinstance(value, torch.Tensor) or isinstance(value, bool):
        return value is not None
    if name == "top_k":
        return not isinstance(value, numbers.Integral) or (value > 0 and (vocab is None or value < vocab))
    if not isinstance(value, numbers.Real):
        return True
    return value != (1 if name == "top_p" else 0)


def sampler_on(top_k=None, top_p=None, min_p=None, softcap=None) -> bool:
    """THE answer to "are the log-probs those of a truncated or soft-capped distribution" (docs/math.md §8), for
    `LossConfig.sampler_on`, `grpo_loss` and the log-prob router alike."""
    rules = (("top_k", top_k), ("top_p", top_p), ("min_p", min_p))
    return softcap is not None or any(rule_on(name, value) for name, value in rules)


def truncation(top_k, top_p, min_p, shape, vocab: int, device) -> Truncation | None:
    """Check and broadcast vLLM's `top_k`, `top_p`, `min_p` (each None, a number, or a per-row `[B]` / per-token
    tensor of targets' `shape`) to `[N]` rows. Returns None when every rule is off on every row (no cost)."""
    # a scalar that is off costs nothing: no per-row tensor is built for it
    top_k = top_k if rule_on("top_k", top_k, vocab) else None
    top_p = top_p if rule_on("top_p", top_p) else None
    min_p = min_p if rule_on("min_p", min_p) else None
    k = _rows_of("top_k", top_k, shape, device, integer=True)
    p = _rows_of("top_p", top_p, shape, device, integer=False)
    m = _rows_of("min_p", min_p, shape, device, integer=False)
    if p is not None and p.numel():
        bad = ~((p > 0) & (p <= 1))
        if bool(bad.any()):
            raise ValueError(f"top_p must be in (0, 1], got {float(p[bad][0])}")
    if m is not None and m.numel():
        bad = ~((m >= 0) & (m <= 1))
        if bool(bad.any()):
            raise ValueError(f"min_p must be in [0, 1], got {float(m[bad][0])}")
    k = None if k is None or not bool(((k > 0) & (k < vocab)).any()) else k
    p = None if p is None or not bool((p < 1).any()) else p
    m = None if m is None or not bool((m > 0).any()) else m
    return None if k is None and p is None and m is None else Truncation(k, p, m)


class Workspace:
    """Tile-sized buffers reused across row chunks: on the CPU a fresh `[C, V]` tensor costs its page faults,
    more than the elementwise pass that fills it. `get(name, c, dtype)` is the named buffer's first c rows."""

    def __init__(self, rows: int, vocab: int, device):
        self.rows, self.vocab, self.device, self.bufs = rows, vocab, device, {}

    def get(self, name: str, c: int, dtype=torch.float32) -> torch.Tensor:
        buf = self.bufs.get(name)
        if buf is None or buf.dtype != dtype:
            buf = self.bufs[name] = torch.empty(self.rows, self.vocab, dtype=dtype, device=self.device)
        return buf[:c]


def _top_p_cut(z, zmax, cut, top_p, has_cut: bool, ws: Workspace):
    """The smallest logit top-p keeps among {z ≥ cut}: a token stays iff the mass ranked strictly above it is
    below top_p·(mass of the set). A histogram of the mass over the logit value finds the bin holding that token;
    the bin's tokens are then ranked exactly (a narrower histogram first when the bin holds too many)."""
    c = z.shape[0]
    e = torch.sub(z, zmax.unsqueeze(1), out=ws.get("e", c)).exp_()
    if has_cut:
        e.masked_fill_(torch.lt(z, cut.unsqueeze(1), out=ws.get("mask", c, torch.bool)), 0.0)
    target = top_p * e.sum(1)
    above = torch.zeros_like(zmax)  # mass above the window
    lo, hi = torch.maximum(cut, zmax - _RANGE), zmax
    u, idx = ws.get("tmp", c), ws.get("idx", c, torch.int64)
    sel, mask = ws.get("sel", c, torch.bool), ws.get("mask", c, torch.bool)
    ones = torch.ones(1, 1, dtype=torch.float32, device=z.device).expand(c, z.shape[1])
    active = count = None  # rows whose window still holds more than _EXACT tokens
    for _ in range(_PASSES):
        # a window of one value (every kept logit tied, e.g. top-k's cut at the max) keeps a finite scale: inf·0
        # would be NaN
        scale = _BINS / (hi - lo).clamp_min(_MIN_WIDTH)
        torch.sub(z, lo.unsqueeze(1), out=u).mul_(scale.unsqueeze(1)).floor_().clamp_(0, _BINS - 1)
        # a token of no mass (outside the window, below the cut, or exp underflow: never kept) goes to bin _BINS
        idx.copy_(u.masked_fill_(torch.le(e, 0.0, out=mask), _BINS))
        hist = torch.zeros(2, c, _BINS + 1, dtype=torch.float32, device=z.device)
        mass, counts = hist[0].scatter_add_(1, idx, e)[:, :_BINS], hist[1].scatter_add_(1, idx, ones)[:, :_BINS]
        incl = mass.flip(1).cumsum(1).add_(above.unsqueeze(1))  # mass of the window's bins from the top down
        j = (incl < target.unsqueeze(1)).sum(1).clamp_(max=_BINS - 1)  # the bin where the mass crosses target
        b = _BINS - 1 - j
        found = counts.gather(1, b.unsqueeze(1)).squeeze(1).long()
        if active is None:
            above = torch.where(j > 0, incl.gather(1, (j - 1).clamp(min=0).unsqueeze(1)).squeeze(1), above)
            count = found
            torch.eq(idx, b.unsqueeze(1), out=sel)
        else:
            # a row settled in an earlier pass keeps its window: its θ never follows how many passes the other
            # rows of the tile need (batch invariance, docs/math.md §1.2)
            above = torch.where(active & (j > 0), incl.gather(1, (j - 1).clamp(min=0).unsqueeze(1)).squeeze(1), above)
            count = torch.where(active, found, count)
            sel.copy_(torch.where(active.unsqueeze(1), idx == b.unsqueeze(1), sel))
        active = count > _EXACT
        if not bool(active.any()):
            break
        e.masked_fill_(torch.logical_not(sel, out=mask), 0.0)
        lo, hi = lo + b / scale, lo + (b + 1) / scale
    k = max(1, int(count.clamp(max=_EXACT).max()))
    cands = u.copy_(z).masked_fill_(torch.logical_not(sel, out=mask), float("-inf"))
    vals = torch.topk(cands, k, dim=1).values  # [C, k], descending
    q = torch.exp(vals - zmax.unsqueeze(1))
    excl = torch.cat([torch.zeros_like(q[:, :1]), q[:, :-1]], 1).cumsum(1).add_(above.unsqueeze(1))
    n_keep = (excl < target.unsqueeze(1)).sum(1).clamp_(1, k)
    smallest = vals.gather(1, (n_keep - 1).unsqueeze(1)).squeeze(1)
    # a window still holding more than _EXACT tokens after every pass holds ties: all of them are kept
    return torch.where(count > _EXACT, vals[:, 0], smallest)


def tile_threshold(z: torch.Tensor, zmax: torch.Tensor, trunc: Truncation, ws: Workspace | None = None):
    """θ `[C]` of a `[C, V]` float32 tile of final logits (zmax `[C]` its row max), vLLM's order: min-p, top-k,
    top-p. S = {z ≥ θ}; θ = −inf when the rules drop nothing. `ws`: reusable buffers (one is made if None)."""
    c, v = z.shape
    ws = Workspace(c, v, z.device) if ws is None else ws
    cut = torch.full((c,), float("-inf"), dtype=torch.float32, device=z.device)
    is_logit = True  # the cut is a logit (then the smallest kept one) unless min-p set it
    if trunc.min_p is not None:
        # p_v < min_p·p_max  ⇔  z_v < z_max + log(min_p)
        on = trunc.min_p > 0
        cut = torch.where(on, zmax + torch.log(trunc.min_p.clamp_min(1e-38)), cut)
        is_logit = False
    if trunc.top_k is not None:
        on = (trunc.top_k > 0) & (trunc.top_k < v)
        if bool(on.any()):
            kmax = int(torch.where(on, trunc.top_k, 0).max())
            vals = torch.topk(z, kmax, dim=1).values
            kth = vals.gather(1, (trunc.top_k.clamp(1, kmax) - 1).unsqueeze(1)).squeeze(1)
            cut = torch.where(on, torch.maximum(cut, kth), cut)  # the k-th largest of what min-p left
    if trunc.top_p is not None:
        on = trunc.top_p < 1
        if bool(on.any()):
            has_cut = trunc.min_p is not None or trunc.top_k is not None
            cut = torch.where(on, _top_p_cut(z, zmax, cut, trunc.top_p, has_cut, ws), cut)
            is_logit = is_logit or bool(on.all())
    kept, tmp = torch.ge(z, cut.unsqueeze(1), out=ws.get("mask", c, torch.bool)), ws.get("tmp", c)
    drop_max = tmp.copy_(z).masked_fill_(kept, float("-inf")).amax(1)
    if is_logit:
        kept_min = torch.where(cut == float("-inf"), zmax, cut)
    else:
        kept_min = tmp.copy_(z).masked_fill_(kept.logical_not_(), float("inf")).amin(1)
    mid = kept_min * 0.5 + drop_max * 0.5
    theta = torch.where(mid > drop_max, mid, kept_min)  # adjacent floats: the midpoint rounds onto one of them
    return torch.where(drop_max == float("-inf"), float("-inf"), theta)
