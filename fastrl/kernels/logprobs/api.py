"""`token_logprobs` / `sampled_token_logprobs`: the public entry points of the log-prob op, and the one router that
picks the path a call runs (docs/math.md §1, §5, §6, §8).

A call is checked once (checks.py), flattened to `[N]` rows, then `route` names its path:

    vocab_parallel   process_group given: the head's rows split over the ranks (vocab_parallel.py)
    replay           kept_ids / kept_offsets given: the sampler's own kept sets, O(Σ|S|) work (replay.py)
    sampled          a truncation rule, a soft-cap, return_topk or a per-token temperature (sampled.py)
    plain            the full softmax at one temperature (function.py)

and `logprob_path` hands back the function that runs it (`_PATHS`, by path and implementation; each lives with its
walk). Each takes the one `_Call` and returns `SampledLogprobs` over the `[N]` rows. Every option of a call is one
field of `LogprobRequest`; `logprob_call` checks it and builds the `_Call`. The loss's router
(fastrl/losses/route.py) builds the call with `logprob_call` and runs `logprob_path(call)` itself, so no module of
this one sits between it and the walk. A new path is one more branch of `route` and one more entry of `_PATHS`.
"""

import dataclasses
from typing import NamedTuple

import torch

from ..dispatch import resolve_impl
from .checks import check_call, check_return_topk, check_softcap, check_targets_range
from .chunked import plain_torch_path
from .function import plain_triton_path
from .invariant import invariant_rows, run_blocks
from .kept_set import KeptSet, check_kept_set
from .params import LogprobParams, SampledLogprobs
from .replay import replay_path
from .sampled import sampled_path, sampled_tile_rows
from .sampling import Truncation, rule_on, truncation
from .vocab_parallel import resolve_shard, shard_layout, vocab_parallel_path

__all__ = [
    "LogprobRequest",
    "logprob_call",
    "logprob_path",
    "route",
    "sampled_token_logprobs",
    "shape_logprobs",
    "token_logprobs",
]


@dataclasses.dataclass(frozen=True)
class LogprobRequest:
    """Every option of one log-prob call besides (hidden, weight, targets): `token_logprobs`' keywords, with their
    defaults and meaning (see its docstring), and `on_missing`. `logprob_call` checks it once."""

    bias: torch.Tensor | None = None  # [V] LM-head bias (this rank's rows with process_group)
    temperature: float | torch.Tensor = 1.0  # a float >= MIN_TEMPERATURE, or one per token (targets' shape)
    ignore_index: int = -100  # targets equal to it give logp = entropy = 0 and no gradient
    return_entropy: bool = False  # also compute the softmax entropy
    impl: str = "auto"  # "auto", "triton" or "torch"
    process_group: object = None  # the vocab-parallel head's group (docs/math.md §6), or None
    top_k: int | torch.Tensor | None = None  # the sampler's truncation (docs/math.md §8); None / <= 0 / >= V: off
    top_p: float | torch.Tensor | None = None  # None or 1: off
    min_p: float | torch.Tensor | None = None  # None or 0: off
    softcap: float | None = None  # the final-logit soft-cap, before the temperature; None: off
    return_topk: int | None = None  # k: also the k most likely tokens' ids and log-probs; None: off
    kept_ids: torch.Tensor | None = None  # the sampler's kept sets, CSR over the N rows (docs/math.md §9), with
    kept_offsets: torch.Tensor | None = None  # kept_offsets [N + 1]; both or neither
    on_missing: str = "raise"  # a live target outside its kept set: "raise" a ValueError, or "mask" it in `outside`
    batch_invariant: bool = False  # a row's results do not depend on the other rows (docs/math.md §1.2)


class _Call(NamedTuple):
    hidden: torch.Tensor  # [N, D]
    weight: torch.Tensor  # [V, D] (this rank's rows on the vocab-parallel path)
    bias: torch.Tensor | None  # [V] or None
    targets: torch.Tensor  # [N] int32 / int64, ignore_index already < 2**31 in magnitude
    params: LogprobParams  # the temperature's one home: a float, or [N] float32 (one per row)
    impl: str  # "triton" or "torch"
    trunc: Truncation | None  # the sampler's rules per row, None when every rule is off
    return_topk: int | None
    group: object  # the process group, or None
    first_row: int  # the vocab-parallel shard's first row (0 otherwise)
    kept: KeptSet | None  # the sampler's kept sets, checked (the replay path), or None


def route(call: _Call) -> str:
    """The path of a checked call: "vocab_parallel", "replay", "sampled" or "plain" (module docstring)."""
    if call.group is not None:
        return "vocab_parallel"
    if call.kept is not None:
        return "replay"
    if call.trunc is not None or call.params.softcap is not None or call.return_topk is not None:
        return "sampled"
    return "sampled" if isinstance(call.params.temperature, torch.Tensor) else "plain"


_PATHS = {
    ("plain", "torch"): plain_torch_path,
    ("plain", "triton"): plain_triton_path,
    ("sampled", "torch"): sampled_path,
    ("sampled", "triton"): sampled_path,
    ("vocab_parallel", "torch"): vocab_parallel_path,
    ("vocab_parallel", "triton"): vocab_parallel_path,
    ("replay", "torch"): replay_path,
    ("replay", "triton"): replay_path,
}


def logprob_path(call: _Call):
    """The function that runs a checked call (`logprob_call`): `[N]` rows in, SampledLogprobs out. The caller calls
    it itself, so nothing of this module sits between it and the path's walk or launch."""
    path = route(call)
    # the torch walks reach invariance through fixed blocks; the Triton kernels and the replay path by themselves
    if call.params.batch_invariant and call.impl == "torch" and path in ("plain", "sampled"):
        return _in_blocks
    return _PATHS[path, call.impl]


def _in_blocks(c: _Call) -> SampledLogprobs:
    """The torch plain or sampled path, batch-invariant: on blocks of a fixed number of live rows (invariant.py)."""
    run = _PATHS[route(c), c.impl]
    live = torch.nonzero(c.targets != c.params.ignore_index).squeeze(-1)
    if live.numel() == 0:
        return run(c)
    vocab, tau = c.weight.shape[0], c.params.temperature
    per_row = isinstance(tau, torch.Tensor)
    rows = invariant_rows(vocab) if run is plain_torch_path else sampled_tile_rows(vocab)
    rules = tuple(zip(c.trunc or (None,) * 3, (0, 1.0, 0.0)))  # a padding row keeps every token

    def block(hidden, targets, rows_tau, *rule_rows):
        trunc = None if c.trunc is None else Truncation(*rule_rows)
        params = dataclasses.replace(c.params, temperature=rows_tau) if per_row else c.params
        return tuple(run(c._replace(hidden=hidden, targets=targets, params=params, trunc=trunc)))

    inputs = ((c.hidden, 0.0), (c.targets, 0), (tau, 1.0) if per_row else (None, None), *rules)
    return SampledLogprobs(*run_blocks(block, live, c.targets.shape[0], rows, inputs))


def _refuse_with_group(r: LogprobRequest) -> None:
    for name, value in (("top_k", r.top_k), ("top_p", r.top_p), ("min_p", r.min_p)):
        if rule_on(name, value):
            shown = "a tensor" if isinstance(value, torch.Tensor) else repr(value)
            raise ValueError(
                f"{name}={shown} is not supported with process_group: the kept set would need a threshold search "
                "across the vocabulary shards (docs/math.md §6); gather the head and call without process_group"
            )
    if r.return_topk is not None:
        raise ValueError(
            f"return_topk={r.return_topk!r} is not supported with process_group (each rank holds only its own "
            "vocabulary rows); gather the head and call without process_group"
        )


def _refuse_with_kept_sets(r: LogprobRequest) -> None:
    for name, value in (("top_k", r.top_k), ("top_p", r.top_p), ("min_p", r.min_p)):
        if rule_on(name, value):
            raise ValueError(
                f"{name} cannot be combined with kept_ids / kept_offsets: the sampler's kept sets already are its "
                "truncation (pass one or the other)"
            )
    if r.process_group is not None:
        raise ValueError(
            "kept_ids / kept_offsets are not supported with process_group: gather the head and call without it "
            "(the replay reads only the kept rows of W, so the gathered head is read once, sparsely)"
        )


def logprob_call(hidden, weight, targets, request: LogprobRequest) -> tuple[_Call, torch.Size]:
    """The checked `_Call` of one call over its `[N]` flattened rows, and targets' shape (the outputs' own)."""
    if not isinstance(request, LogprobRequest):
        raise TypeError(f"request must be a LogprobRequest, got {type(request).__name__}")
    r = request
    if not isinstance(r.batch_invariant, bool):
        raise TypeError(f"batch_invariant must be a bool, got {r.batch_invariant!r}")
    if r.batch_invariant and r.process_group is not None:
        raise ValueError(
            "batch_invariant=True is not supported with process_group: gather the head and call without it"
        )
    replay = r.kept_ids is not None or r.kept_offsets is not None
    if replay:
        if r.kept_ids is None or r.kept_offsets is None:
            raise ValueError("kept_ids and kept_offsets come together: pass both (the CSR of the kept sets) or neither")
        _refuse_with_kept_sets(r)
    bias, process_group = r.bias, r.process_group
    if process_group is not None:
        _refuse_with_group(r)
        weight, bias, process_group = resolve_shard(weight, bias, process_group)
    elif hasattr(weight, "device_mesh"):
        raise TypeError(
            "weight is a DTensor: pass process_group= for a vocab-parallel call (hidden and targets identical on "
            "every rank), or gather it into a plain tensor first"
        )
    temperature, ignore_index = r.temperature, r.ignore_index
    check_call(hidden, weight, targets, bias, temperature, ignore_index, sharded=process_group is not None)
    softcap, ignore_index, lead = check_softcap(r.softcap), int(ignore_index), targets.shape
    impl = resolve_impl(r.impl, hidden.device)
    vocab, first_row = weight.shape[0], 0
    if process_group is not None:
        first_row, vocab = shard_layout(weight.shape[0], process_group, hidden.device)
        if vocab == 0:
            raise ValueError("weight must hold at least one token (V >= 1) over the ranks of process_group, got 0")
    trunc = truncation(r.top_k, r.top_p, r.min_p, lead, vocab, hidden.device)
    check_return_topk(r.return_topk, vocab)
    wide_ignore = not -(2**31) <= ignore_index < 2**31
    if targets.dtype != torch.int64 and (wide_ignore or targets.dtype != torch.int32):
        # A narrower dtype wraps ignore_index in comparisons (uint8 156 == -100, int32 0 == 2**40).
        targets = targets.long()
    check_targets_range(targets, vocab, ignore_index)
    if wide_ignore:
        # The kernels compare targets in int32: move an ignore_index beyond that range to -1, which the
        # range check above guarantees is not a real target.
        targets = torch.where(targets == ignore_index, -1, targets)
        ignore_index = -1
    per_token = isinstance(temperature, torch.Tensor)
    tau = temperature.reshape(-1).float() if per_token else float(temperature)
    params = LogprobParams(tau, ignore_index, bool(r.return_entropy), softcap, r.batch_invariant)
    h2 = hidden.reshape(targets.numel(), hidden.shape[-1])  # not -1: D = 0 or N = 0 leave -1 ambiguous
    t1 = targets.reshape(-1)
    kept = check_kept_set(r.kept_ids, r.kept_offsets, t1, ignore_index, vocab, r.on_missing) if replay else None
    call = _Call(h2, weight, bias, t1, params, impl, trunc, r.return_topk, process_group, first_row, kept)
    return call, lead


def shape_logprobs(out: SampledLogprobs, call: _Call, lead: torch.Size) -> SampledLogprobs:
    """A path's `[N]`-row outputs shaped like targets (`lead`); `outside` all False where nothing was truncated."""
    k, device = call.return_topk, call.hidden.device
    return SampledLogprobs(
        out.logp.reshape(lead),
        None if out.entropy is None else out.entropy.reshape(lead),
        torch.zeros(lead, dtype=torch.bool, device=device) if out.outside is None else out.outside.reshape(lead),
        None if k is None else out.topk_ids.reshape(*lead, k),
        None if k is None else out.topk_logprobs.reshape(*lead, k),
    )


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
    kept_ids: torch.Tensor | None = None,
    kept_offsets: torch.Tensor | None = None,
    batch_invariant: bool = False,
):
    """Log-probability of each target token, straight from hidden states and the LM-head weight.

    Never materializes the `[N, V]` logits, forward or backward (docs/math.md §1).

    Args:
        hidden: `[..., D]` float16/bfloat16/float32 hidden states (the LM body's output).
        weight: `[V, D]` LM-head weight, same dtype and device as hidden.
        targets: `[...]` integer token ids (hidden's leading shape); `ignore_index` rows give 0.
        bias: optional `[V]` LM-head bias.
        temperature: the final logits are divided by it: a float >= 1e-6 (`MIN_TEMPERATURE`), or a tensor of
            targets' shape (one temperature per token, e.g. a sampler's per-sample one broadcast), applied after
            the bias and the soft-cap.
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
            top_p = 1 and min_p = 0 are off and cost nothing. A rule that is on with process_group is a ValueError.
        softcap: the model's final-logit soft-cap `cap·tanh(x / cap)`, applied before the temperature (also with
            process_group: it is elementwise, each rank caps its own columns).
        return_topk: k: also return the ids `[..., k]` (int64) and log-probs `[..., k]` (float32, no gradient) of
            the k most likely tokens of the (truncated) distribution; −inf for a token outside the kept set. Not
            with process_group (ValueError). With kept sets: the top of each row's set, id −1 and −inf past its end.
        kept_ids, kept_offsets: the sampler's kept sets (docs/math.md §9), vLLM's CSR layout over the N flattened
            rows of targets: row i's set is `kept_ids[kept_offsets[i]:kept_offsets[i + 1]]` (ids int32/int64, in
            any order, no repeats, in [0, V); offsets `[N + 1]` int, from 0 to len(kept_ids)); an ignored row's set
            is empty, a live row's is not, and must hold the row's target (else a ValueError naming the row). logp
            and entropy are then those of softmax over the set, at O(Σ|S|·D) cost (never the `[N, V]` logits):
            see `kept_set_from_vllm`. Not with top_k / top_p / min_p nor process_group (ValueError).
        batch_invariant: a row's logp, entropy, top-k export and d_hidden are the same bits whichever rows share
            the call, their number and order (docs/math.md §1.2), in both implementations; it costs speed at small
            N (fixed tiles and vocab splits). The replay path always is. Not with process_group (ValueError).

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
    request = LogprobRequest(
        bias=bias, temperature=temperature, ignore_index=ignore_index, return_entropy=return_entropy, impl=impl,
        process_group=process_group, top_k=top_k, top_p=top_p, min_p=min_p, softcap=softcap,
        return_topk=return_topk, kept_ids=kept_ids, kept_offsets=kept_offsets, batch_invariant=batch_invariant,
    )  # fmt: skip
    call, lead = logprob_call(hidden, weight, targets, request)
    out = shape_logprobs(logprob_path(call)(call), call, lead)
    res = (out.logp,) + ((out.entropy,) if return_entropy else ())
    res += (out.topk_ids, out.topk_logprobs) if return_topk is not None else ()
    return res[0] if len(res) == 1 else res


def sampled_token_logprobs(
    hidden, weight, targets, *, bias=None, temperature=1.0, ignore_index=-100, return_entropy=False, impl="auto",
    top_k=None, top_p=None, min_p=None, softcap=None, return_topk=None, kept_ids=None, kept_offsets=None,
    batch_invariant=False,
) -> SampledLogprobs:  # fmt: skip
    """`token_logprobs` with the sampler's options (docs/math.md §8, §9), every output in one SampledLogprobs shaped
    like targets, `outside` included (the target is not in the kept set; all False when nothing is dropped).

    With kept_ids / kept_offsets a target outside its row's set is not an error here: `outside` flags the row,
    whose logp stays finite (z_y − log Σ_S exp z, with its gradient) for the caller to leave out."""
    request = LogprobRequest(
        bias=bias, temperature=temperature, ignore_index=ignore_index, return_entropy=return_entropy, impl=impl,
        top_k=top_k, top_p=top_p, min_p=min_p, softcap=softcap, return_topk=return_topk, kept_ids=kept_ids,
        kept_offsets=kept_offsets, on_missing="mask", batch_invariant=batch_invariant,
    )  # fmt: skip
    call, lead = logprob_call(hidden, weight, targets, request)
    return shape_logprobs(logprob_path(call)(call), call, lead)
