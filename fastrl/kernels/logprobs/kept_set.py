"""The sampler's kept sets in CSR form (docs/math.md §9): their contract, and the conversion from vLLM's masks.

Row i's set is `kept_ids[kept_offsets[i]:kept_offsets[i + 1]]`, the rows being the flattened targets. The
checks run once per call, on O(M) integer tensors (M = len(kept_ids)); the result, `KeptSet`, carries what
both implementations need: each pair's row, the pairs' stable order by token id (the deterministic d_weight
reduction and the duplicate check share it), and where each row's target sits in its set.
"""

from typing import NamedTuple

import torch

__all__ = ["KeptSet", "check_kept_set", "keep_rows", "kept_set_from_vllm"]

_INT_DTYPES = (torch.int32, torch.int64)


class KeptSet(NamedTuple):
    ids: torch.Tensor  # [M] int64 token ids, in the caller's order
    offsets: torch.Tensor  # [N + 1] int64
    rows: torch.Tensor  # [M] int64: the row of each pair (non-decreasing)
    order: torch.Tensor  # [M] int64: the pairs sorted by token id, stably (so by row within an id)
    target_pos: torch.Tensor  # [N] int64: the pair holding the row's target, −1 when none (ignored or missing)
    missing: torch.Tensor  # [N] bool: a live row whose target is not in its set


def _check_csr_tensors(kept_ids, kept_offsets, n: int, device: torch.device) -> None:
    for name, t in (("kept_ids", kept_ids), ("kept_offsets", kept_offsets)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _INT_DTYPES:
            raise TypeError(f"{name} must be int32 or int64, got dtype {t.dtype}")
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
        if t.device != device:
            raise ValueError(f"{name} must be on hidden's device {device}, got {t.device}")
    if kept_offsets.shape[0] != n + 1:
        raise ValueError(f"kept_offsets must be [N + 1] = [{n + 1}] for N = {n} rows, got {tuple(kept_offsets.shape)}")


def _check_csr(kept_ids, kept_offsets, n: int, device):
    """The CSR's structure: (ids int64, offsets int64, sizes `[N]`), or an error naming the bad value."""
    _check_csr_tensors(kept_ids, kept_offsets, n, device)
    offsets, ids = kept_offsets.long(), kept_ids.long()
    m = ids.shape[0]
    if int(offsets[0]) != 0:
        raise ValueError(f"kept_offsets[0] must be 0, got {int(offsets[0])}")
    if int(offsets[-1]) != m:
        raise ValueError(f"kept_offsets[-1] must equal len(kept_ids) = {m}, got {int(offsets[-1])}")
    sizes = offsets.diff()
    if n and bool((sizes < 0).any()):
        row = _first_row(sizes < 0)
        lo, hi = int(offsets[row]), int(offsets[row + 1])
        raise ValueError(f"kept_offsets must be non-decreasing: row {row} has offsets {lo}..{hi}")
    return ids, offsets, sizes


def keep_rows(kept_ids, kept_offsets, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The CSR with the sets of rows where `keep` (`[N]` bool) is False emptied: (ids, offsets `[N + 1]`)."""
    ids, offsets, sizes = _check_csr(kept_ids, kept_offsets, keep.shape[0], keep.device)
    rows = torch.repeat_interleave(torch.arange(keep.shape[0], device=keep.device), sizes, output_size=ids.shape[0])
    new = torch.zeros_like(offsets)
    torch.cumsum(torch.where(keep, sizes, 0), 0, out=new[1:])
    return kept_ids[keep[rows]], new


def _first_row(bad: torch.Tensor) -> int:
    return int(torch.nonzero(bad)[0, 0])


def check_kept_set(
    kept_ids: torch.Tensor,
    kept_offsets: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int,
    vocab: int,
    on_missing: str = "raise",
) -> KeptSet:
    """Check the CSR sets of the `[N]` targets and prepare them; raise naming the first bad row.

    Contract: ids int32/int64 in [0, vocab), any order within a row, no id twice in a row; offsets `[N + 1]`,
    offsets[0] = 0, non-decreasing, offsets[N] = len(kept_ids); an ignored row's set is empty, a live row's is
    not. A live row whose target is outside its set raises with `on_missing="raise"`; with "mask" it is
    flagged in `KeptSet.missing` (its log-prob stays finite: z_y − log Σ_S exp z).
    """
    if on_missing not in ("raise", "mask"):
        raise ValueError(f"on_missing must be 'raise' or 'mask', got {on_missing!r}")
    n, dev = targets.shape[0], targets.device
    ids, offsets, sizes = _check_csr(kept_ids, kept_offsets, n, dev)
    m = ids.shape[0]
    rows = torch.repeat_interleave(torch.arange(n, device=dev), sizes, output_size=m)
    bad = (ids < 0) | (ids >= vocab)
    if m and bool(bad.any()):
        j = _first_row(bad)
        raise ValueError(f"row {int(rows[j])}'s kept set holds token id {int(ids[j])}, outside [0, V={vocab})")
    valid = targets != ignore_index
    out_of_range = valid & ((targets < 0) | (targets >= vocab))
    if n and bool(out_of_range.any()):
        row = _first_row(out_of_range)
        raise ValueError(f"row {row}'s target {int(targets[row])} is outside [0, {vocab}) and is not ignore_index")
    if n and bool((~valid & (sizes > 0)).any()):
        row = _first_row(~valid & (sizes > 0))
        raise ValueError(f"row {row} is ignored (target = ignore_index={ignore_index}) but its kept set is not empty")
    if n and bool((valid & (sizes == 0)).any()):
        raise ValueError(f"row {_first_row(valid & (sizes == 0))} is live but its kept set is empty")
    order = torch.sort(ids, stable=True).indices
    same = (ids[order[1:]] == ids[order[:-1]]) & (rows[order[1:]] == rows[order[:-1]])
    if m > 1 and bool(same.any()):
        j = order[_first_row(same)]
        raise ValueError(f"row {int(rows[j])}'s kept set holds token id {int(ids[j])} twice")
    hit = ids == targets[rows]  # an ignored row has no pairs; at most one hit per row (no duplicates)
    target_pos = torch.full((n,), -1, dtype=torch.int64, device=dev)
    target_pos[rows[hit]] = torch.nonzero(hit).squeeze(1)
    missing = valid & (target_pos < 0)
    if on_missing == "raise" and n and bool(missing.any()):
        row = _first_row(missing)
        raise ValueError(f"row {row}'s target {int(targets[row])} is not in its kept set (the sampler never kept it)")
    return KeptSet(ids, offsets, rows, order, target_pos, missing)


def kept_set_from_vllm(sampling_masks, completion_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's kept sets of a batch of completions → the CSR `(kept_ids, kept_offsets)` of its `[B, T]` rows.

    Args:
        sampling_masks: one per completion (row of completion_mask), each a `vllm.outputs.SamplingMask` (or any
            object with `token_ids`: one list of kept token ids per generated token, in order).
        completion_mask: `[B, T]` bool / 0-1 tensor; row b's True positions are completion b's generated tokens,
            in order, one per entry of its `token_ids`.

    Returns:
        kept_ids `[M]` int32 and kept_offsets `[B·T + 1]` int64 for the flattened `[B, T]` rows (a padding
        position's set is empty), on completion_mask's device: `token_logprobs(..., kept_ids=, kept_offsets=)`.
    """
    if not isinstance(completion_mask, torch.Tensor) or completion_mask.dim() != 2:
        raise ValueError(f"completion_mask must be a [B, T] tensor, got {getattr(completion_mask, 'shape', None)}")
    masks = list(sampling_masks)
    b, t = completion_mask.shape
    if len(masks) != b:
        raise ValueError(f"got {len(masks)} sampling masks for a completion_mask of {b} rows")
    live = completion_mask.detach().to("cpu").bool()
    sizes = torch.zeros(b, t, dtype=torch.int64)
    flat: list[int] = []
    for i, mask in enumerate(masks):
        sets = getattr(mask, "token_ids", None)
        if sets is None:
            raise TypeError(f"sampling mask {i} has no token_ids (got {type(mask).__name__}); ask vLLM for it")
        positions = torch.nonzero(live[i]).squeeze(1)
        if len(sets) != positions.numel():
            raise ValueError(
                f"completion {i}: its sampling mask has {len(sets)} kept sets but completion_mask marks "
                f"{positions.numel()} tokens"
            )
        for pos, kept in zip(positions.tolist(), sets):
            sizes[i, pos] = len(kept)
            flat.extend(kept)
    offsets = torch.zeros(b * t + 1, dtype=torch.int64)
    torch.cumsum(sizes.reshape(-1), 0, out=offsets[1:])
    ids = torch.tensor(flat, dtype=torch.int32)
    return ids.to(completion_mask.device), offsets.to(completion_mask.device)
