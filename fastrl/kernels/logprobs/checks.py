"""The input checks of the hidden-states ops: one home for each rule, each error naming the bad value (docs/math.md §5).

`check_temperature` is THE temperature rule (a float or a per-token tensor, finite and >= MIN_TEMPERATURE),
used by the kernels' entry points, `LossConfig` and `grpo_loss` alike.
"""

import numbers

import torch

from .params import MIN_TEMPERATURE

__all__ = [
    "check_call",
    "check_inputs",
    "check_return_topk",
    "check_softcap",
    "check_targets_range",
    "check_temperature",
]


def check_temperature(temperature, shape: tuple | None = None, device: torch.device | None = None) -> None:
    """A temperature: a real number, or (with `shape`) a floating tensor of that shape on `device`; finite and
    >= MIN_TEMPERATURE everywhere (below it float32 logits overflow). Raises TypeError / ValueError naming it."""
    if isinstance(temperature, torch.Tensor) and shape is not None:
        if not temperature.is_floating_point():
            raise TypeError(f"a temperature tensor must be floating, got dtype {temperature.dtype}")
        if tuple(temperature.shape) != tuple(shape):
            raise ValueError(f"a temperature tensor must have shape {tuple(shape)}, got {tuple(temperature.shape)}")
        if temperature.device != device:
            raise ValueError(f"a temperature tensor must be on {device}, got {temperature.device}")
        bad = ~(temperature.isfinite() & (temperature >= MIN_TEMPERATURE))
        if temperature.numel() and bool(bad.any()):
            raise ValueError(
                f"temperature must be finite and >= {MIN_TEMPERATURE} (MIN_TEMPERATURE) everywhere, found "
                f"{float(temperature[bad][0])}"
            )
        return
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a float, got {type(temperature).__name__}")
    if not MIN_TEMPERATURE <= temperature < float("inf"):
        raise ValueError(
            f"temperature must be a finite number >= {MIN_TEMPERATURE} (MIN_TEMPERATURE: smaller ones overflow "
            f"float32 logits), got {temperature}"
        )


def check_inputs(hidden, weight, targets, bias, sharded: bool = False) -> None:
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


def check_call(hidden, weight, targets, bias, temperature, ignore_index, sharded: bool = False) -> None:
    """The checks every hidden-states op shares: shapes, dtypes and devices, the temperature (a float, or a
    per-token tensor shaped like targets) and an int `ignore_index`; raises naming the bad value."""
    check_inputs(hidden, weight, targets, bias, sharded)
    check_temperature(temperature, targets.shape, hidden.device)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__} {ignore_index!r}")


def check_targets_range(targets: torch.Tensor, vocab: int, ignore_index: int) -> None:
    """Every target is in [0, vocab) or is ignore_index."""
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= vocab))
    if targets.numel() and bool(bad.any()):
        value = int(targets[bad][0])
        raise ValueError(f"target {value} is outside [0, {vocab}) and is not ignore_index={ignore_index}")


def check_softcap(softcap) -> float | None:
    """None, or a finite float > 0 (returned as a float)."""
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a float or None, got {type(softcap).__name__} {softcap!r}")
    if not 0 < softcap < float("inf"):
        raise ValueError(f"softcap must be finite and > 0, got {softcap}")
    return float(softcap)


def check_return_topk(return_topk, vocab: int) -> None:
    if return_topk is not None and (
        isinstance(return_topk, bool) or not isinstance(return_topk, numbers.Integral) or not 0 < return_topk <= vocab
    ):
        raise ValueError(f"return_topk must be None or an int in [1, V={vocab}], got {return_topk!r}")
