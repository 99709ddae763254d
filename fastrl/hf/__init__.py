"""Hugging Face causal LMs as fastrl uses them, in one place (torch only; duck-typed, transformers not imported):

    head.py           the body that stops before the LM head, and the head's weight / bias / soft-cap, for the
                      fused loss (`lm_body_and_head`, `hidden_and_head`, `head_softcap`)
    tiled_mlp.py      a long micro-batch's MLPs in token tiles (`tile_mlps`)
    checkpointing.py  gradient checkpointing that keeps the attention kernel's outputs (`keep_attention_outputs`)

The trainer's builder and the TRL / verl integrations import it; it imports no other fastrl package.
"""

from .checkpointing import ATTENTION_OPS, enable_checkpointing, keep_attention_in_checkpoints, keep_attention_outputs
from .head import head_softcap, hidden_and_head, lm_body_and_head
from .tiled_mlp import tile_mlps, tile_rows

__all__ = [
    "ATTENTION_OPS",
    "enable_checkpointing",
    "head_softcap",
    "hidden_and_head",
    "keep_attention_in_checkpoints",
    "keep_attention_outputs",
    "lm_body_and_head",
    "tile_mlps",
    "tile_rows",
]
