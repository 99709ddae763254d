"""Token-tiled MLPs: a decoder layer's MLP over a long micro-batch, about a thousand tokens at a time.

A transformer's MLP is the same function on every token, and its intermediate activations (gate, up, their
product: 3-4 × `intermediate_size` floats a token, 78 KB at Qwen2.5-0.5B's 4864) are most of what a decoder
layer holds while it is recomputed under gradient checkpointing. At 32k-token sequences that transient is GBs.
`tile_mlps(model)` makes every `*MLP` module of the model run on tiles of `rows` tokens: the forward keeps
only its input; the backward recomputes each tile's MLP and backpropagates it before the next, so the
transient is one tile's. The result is the same function (each token's output does not depend on the tiling;
the weight gradients are sums over the same tokens, in tiles). Inputs of at most `rows` tokens take the module's
own forward, untouched.

The MLP is two autograd nodes. `_KeepInput` saves the input and, in the backward, runs the tiles; `_TileOutputs`
after it forms the output and saves nothing, its backward handing the output's gradient back to `_KeepInput`.
Under non-reentrant gradient checkpointing the input is then the layer's last saved tensor, packed before the
output is formed, so the layer's recomputation stops there (the checkpoint's early stop) and never runs the
whole sequence's MLP a second time. Each MLP runs every token twice a step (the forward, then its tile's
forward and backward), the work of an untiled checkpointed MLP, and holds nothing beyond the checkpoint's.
The tiles run under the autocast state of the forward.
"""

import types

import torch

__all__ = ["tile_mlps", "tile_rows"]


def tile_rows(intermediate_size: int) -> int:
    """Tokens per tile: 1024, or more when the MLP is narrower than 1024 (about 1M floats for each
    `[rows, intermediate]` activation). About six such activations are live in a tile's backward: 24 MiB in
    fp32 at `intermediate_size` 1024, 222 MiB in bf16 at a 7B model's 18,944. 1024-row GEMMs still run at
    full rate (docs/trainer.md)."""
    return max(1024, 2**20 // max(1, intermediate_size))


class _KeepInput(torch.autograd.Function):
    """Identity on x, saving x and the MLP's parameters; its backward gets d(MLP output) and runs the tiles."""

    @staticmethod
    def forward(ctx, forward, rows, x, *params):
        ctx.forward, ctx.rows = forward, rows
        device = x.device.type  # the backward's tiles run under the forward's autocast state, as a checkpoint does
        ctx.autocast = dict(
            device_type=device, dtype=torch.get_autocast_dtype(device), enabled=torch.is_autocast_enabled(device)
        )
        ctx.save_for_backward(x, *params)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        x, *params = ctx.saved_tensors
        flat, grad = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
        live = [p for p in params if p.requires_grad]
        d_params = [torch.zeros_like(p) for p in live]
        d_x = torch.empty_like(flat) if ctx.needs_input_grad[2] else None
        for start in range(0, flat.shape[0], ctx.rows):
            tile = flat[start : start + ctx.rows].detach().requires_grad_(d_x is not None)
            with torch.enable_grad(), torch.autocast(**ctx.autocast):
                out = ctx.forward(tile)
            wrt = ([tile] if d_x is not None else []) + live
            grads = torch.autograd.grad(out, wrt, grad[start : start + ctx.rows], allow_unused=True)
            if d_x is not None:
                d_x[start : start + ctx.rows] = grads[0]
                grads = grads[1:]
            for acc, g in zip(d_params, grads):
                if g is not None:
                    acc.add_(g)
        it = iter(d_params)
        d_all = [next(it) if p.requires_grad else None for p in params]
        return (None, None, None if d_x is None else d_x.view(x.shape), *d_all)


class _TileOutputs(torch.autograd.Function):
    """The MLP's output from `_KeepInput`'s handle, tile by tile, saving nothing; its backward hands the output's
    gradient to `_KeepInput` unchanged (an MLP keeps the hidden size, so it has the handle's shape)."""

    @staticmethod
    def forward(ctx, forward, rows, handle):
        out = _tiled(forward, rows, handle)
        if out.shape != handle.shape:
            raise ValueError(
                f"tile_mlps: an MLP mapped {tuple(handle.shape)} to {tuple(out.shape)}; only MLPs that keep the "
                "hidden size can be tiled"
            )
        return out

    @staticmethod
    def backward(ctx, grad):
        return None, None, grad


def _tiled(forward, rows: int, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    out = torch.cat([forward(tile) for tile in flat.split(rows)])
    return out.view(*x.shape[:-1], out.shape[-1])


def _tiled_forward(self, x, *args, **kwargs):
    rows = self._fastrl_tile_rows
    if args or kwargs or x.shape[:-1].numel() <= rows:
        return self._fastrl_forward(x, *args, **kwargs)
    if not torch.is_grad_enabled():
        return _tiled(self._fastrl_forward, rows, x)
    handle = _KeepInput.apply(self._fastrl_forward, rows, x, *self.parameters())
    return _TileOutputs.apply(self._fastrl_forward, rows, handle)


def tile_mlps(model: torch.nn.Module, rows: int | None = None) -> int:
    """Make each `*MLP` submodule of `model` (Llama / Qwen / Mistral style) run in token tiles; idempotent.

    Args:
        model: a Hugging Face causal LM (or any module whose per-token MLP classes end in "MLP").
        rows: tokens per tile; default `tile_rows(intermediate_size)` of each module.

    Returns:
        The number of MLP modules tiled by this call.
    """
    if rows is not None and rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    count = 0
    for module in model.modules():
        if not type(module).__name__.endswith("MLP") or hasattr(module, "_fastrl_forward"):
            continue
        width = getattr(getattr(module, "up_proj", None), "out_features", None) or 4 * 1024
        module._fastrl_tile_rows = rows or tile_rows(width)
        module._fastrl_forward = module.forward
        module.forward = types.MethodType(_tiled_forward, module)
        count += 1
    return count
