"""Random replay problems for the replay tests: kept sets of uneven sizes in CSR form, and the float64 oracle."""

from types import SimpleNamespace

import torch

from fastrl import token_logprobs
from fastrl.kernels import replay_logprobs_reference, sampled_token_logprobs

IGNORE = -100


def replayed(hidden, weight, targets, kept_ids, kept_offsets, *, on_missing="raise", **kw):
    """The replay call through the public API: `token_logprobs` (a target outside its set raises) or, with
    on_missing="mask", `sampled_token_logprobs` (it is flagged). Returns logp, entropy, missing, topk_*."""
    kw = {"ignore_index": IGNORE, "return_entropy": True, "kept_ids": kept_ids, "kept_offsets": kept_offsets, **kw}
    if on_missing == "mask":
        out = sampled_token_logprobs(hidden, weight, targets, **kw)
        return SimpleNamespace(logp=out.logp, entropy=out.entropy, missing=out.outside, topk_ids=out.topk_ids,
                               topk_logprobs=out.topk_logprobs)  # fmt: skip
    logp, entropy, *top = token_logprobs(hidden, weight, targets, **kw)
    return SimpleNamespace(logp=logp, entropy=entropy, missing=None, topk_ids=top[0] if top else None,
                           topk_logprobs=top[1] if top else None)  # fmt: skip


def kept_sets(targets, vocab, k, full_rows=(), gen=None, id_dtype=torch.int32):
    """Per live row a random set of 1..k ids holding its target (all V ids on `full_rows`), shuffled; empty
    on ignored rows. Returns (kept_ids, kept_offsets int64, sets as lists)."""
    sets = []
    for i, y in enumerate(targets.tolist()):
        if y == IGNORE:
            sets.append([])
            continue
        size = vocab if i in full_rows else int(torch.randint(1, k + 1, (), generator=gen))
        ids = torch.randperm(vocab, generator=gen)[:size].tolist()
        if y not in ids:
            ids[int(torch.randint(0, size, (), generator=gen))] = y
        sets.append(ids)
    offsets = torch.tensor([0] + [len(s) for s in sets]).cumsum(0)
    return torch.tensor([x for s in sets for x in s], dtype=id_dtype), offsets, sets


def make_case(n=29, d=40, v=53, k=9, dtype=torch.float32, head=None, bias=False, seed=0, full_rows=(4,),
              ignored=(2, 11)):  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    head = head or dtype
    case = {
        "hidden": torch.randn(n, d, generator=gen).to(dtype),
        "weight": (torch.randn(v, d, generator=gen) * 0.4).to(head),
        "bias": (torch.randn(v, generator=gen) * 0.5).to(head) if bias else None,
        "targets": torch.randint(0, v, (n,), generator=gen),
    }
    case["targets"][list(ignored)] = IGNORE
    case["kept_ids"], case["kept_offsets"], case["sets"] = kept_sets(case["targets"], v, k, full_rows, gen)
    return case


def run(case, impl, *, temperature=1.0, softcap=None, grad=True, seed=1, **kw):
    """(logp, entropy, d_hidden, d_weight, d_bias) of one call with random upstream gradients (None if no grad)."""
    gen = torch.Generator().manual_seed(seed)
    leaves = [
        case[x].clone().requires_grad_(grad) if case[x] is not None else None for x in ("hidden", "weight", "bias")
    ]
    out = replayed(
        leaves[0], leaves[1], case["targets"], case["kept_ids"], case["kept_offsets"], bias=leaves[2],
        temperature=temperature, softcap=softcap, impl=impl, **kw,
    )  # fmt: skip
    n = case["targets"].shape[0]
    g, e = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    if not grad:
        return out.logp, out.entropy, None, None, None
    live = [x for x in leaves if x is not None]
    grads = iter(torch.autograd.grad((out.logp * g + out.entropy * e).sum(), live))
    return (out.logp, out.entropy, *(next(grads) if x is not None else None for x in leaves))


def oracle(case, *, temperature=1.0, softcap=None, seed=1):
    """The same five quantities from float64 materialized logits with the sets as a mask."""
    gen = torch.Generator().manual_seed(seed)
    leaves = [case[x].double().requires_grad_() if case[x] is not None else None for x in ("hidden", "weight", "bias")]
    tau = temperature.double() if isinstance(temperature, torch.Tensor) else temperature
    ref = replay_logprobs_reference(
        leaves[0], leaves[1], case["targets"], case["kept_ids"], case["kept_offsets"], leaves[2],
        temperature=tau, softcap=softcap, ignore_index=IGNORE,
    )  # fmt: skip
    n = case["targets"].shape[0]
    g, e = torch.randn(n, generator=gen).double(), torch.randn(n, generator=gen).double()
    live = [x for x in leaves if x is not None]
    grads = iter(torch.autograd.grad((ref["logp"] * g + ref["entropy"] * e).sum(), live))
    return (ref["logp"].detach(), ref["entropy"].detach(), *(next(grads) if x is not None else None for x in leaves))
