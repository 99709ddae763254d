"""Hugging Face causal LMs as inputs to the fused loss: the body that stops before the head, and the head.

`grpo_loss` wants the final-normed hidden states and the LM-head weight (docs/math.md §1, §5), so the
`[tokens, V]` logits are never built. `lm_body_and_head` finds both on a `*ForCausalLM` model;
`hidden_and_head` also runs the body. Duck-typed: transformers is not imported here.

    hidden, weight, bias = hidden_and_head(model, input_ids, attention_mask=attention_mask)
    out = grpo_loss(hidden[:, P - 1 : -1], weight, input_ids[:, P:], mask, advantages, bias=bias, ...)

Tied embeddings need nothing special: the head's weight IS the input embedding's Parameter, so autograd
adds both gradients. Models that multiply their logits by a constant get that constant folded into the
returned weight and bias (exact: the scaled logits are `hidden @ (s W)^T + s b`). Models whose logits
go through a soft-cap (Gemma 2/3) need `return_softcap=True`: the cap is returned and must be given to the loss
(`LossConfig(softcap=...)`); without it they are refused, so a capped model never gets uncapped log-probs.
"""

import numbers

import torch

__all__ = ["head_softcap", "hidden_and_head", "lm_body_and_head"]

# config.model_type -> how the model applies `config.logits_scaling` to its logits (the same field name
# means opposite things in different families, so an unknown family is refused, not guessed).
_LOGITS_SCALING = {
    "granite": "divide",
    "granitemoe": "divide",
    "granitemoeshared": "divide",
    "granitemoehybrid": "divide",
    "hyperclovax": "multiply",
}


def _text_config(model):
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        return config.get_text_config()
    return config


def _logit_scale(model) -> float:
    """The constant the model multiplies its logits by after the head (1.0 for most models)."""
    config = _text_config(model)
    scale = 1.0
    cohere = getattr(model, "logit_scale", None)  # Cohere: logits * logit_scale
    if cohere is not None:
        if isinstance(cohere, bool) or not isinstance(cohere, numbers.Real):
            raise ValueError(f"{type(model).__name__}.logit_scale must be a number, got {cohere!r}")
        scale *= float(cohere)
    falcon = getattr(getattr(model, "model", None), "lm_head_multiplier", None)  # Falcon-H1
    if isinstance(falcon, numbers.Real) and not isinstance(falcon, bool):
        scale *= float(falcon)
    value = getattr(config, "logits_scaling", None)
    if value is not None and value != 1:
        kind = _LOGITS_SCALING.get(getattr(config, "model_type", None))
        if kind is None:
            raise ValueError(
                f"{type(model).__name__} has config.logits_scaling={value} and model_type="
                f"{getattr(config, 'model_type', None)!r}: whether it multiplies or divides the logits is not "
                "known for this model family; not supported"
            )
        scale *= float(value) if kind == "multiply" else 1.0 / float(value)
    if not (scale > 0 and scale != float("inf")):
        raise ValueError(f"{type(model).__name__}: logit scale must be finite and > 0, got {scale}")
    return scale


def head_softcap(model) -> float | None:
    """The model's final-logit soft-cap (Gemma 2/3's `final_logit_softcapping`), or None: pass it as
    `LossConfig(softcap=...)` / `token_logprobs(..., softcap=...)` (docs/math.md §8)."""
    softcap = getattr(_text_config(model), "final_logit_softcapping", None)
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real) or not 0 < softcap < float("inf"):
        raise ValueError(f"{type(model).__name__}: final_logit_softcapping must be finite and > 0, got {softcap!r}")
    return float(softcap)


def _refuse_softcap(model, return_softcap: bool) -> None:
    cap = head_softcap(model)
    if cap is not None and not return_softcap:
        raise ValueError(
            f"{type(model).__name__} soft-caps its logits (final_logit_softcapping={cap}): pass return_softcap=True "
            "and give the cap to the loss (LossConfig(softcap=...) or token_logprobs(..., softcap=...))"
        )


def lm_body_and_head(model, *, return_softcap: bool = False):
    """The body and head of a Hugging Face causal LM, for `grpo_loss` / `token_logprobs`.

    Args:
        model: a `*ForCausalLM`-style module: `get_output_embeddings()` (or `lm_head`) is the head and
            `get_decoder()` (or the `base_model_prefix` attribute) the body, whose output's
            `last_hidden_state` is the hidden state after the final norm.

        return_softcap: also return the model's final-logit soft-cap (None for most models). A model that
            soft-caps its logits is refused without it: the cap must reach the loss.

    Returns:
        (body, weight `[V, D]`, bias `[V]` or None[, softcap]) such that `softcap(hidden @ weight.T + bias)`
        are exactly the model's logits. Without a logit scale, `weight` and `bias` are the head's own Parameters
        (tied embeddings included); with one, a differentiable product of them.

    Raises:
        ValueError: no separable body and linear head, or a logit transform that is not a constant scale.
    """
    name = type(model).__name__
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        head = getattr(model, "lm_head", None)
    body = model.get_decoder() if hasattr(model, "get_decoder") else None
    if body is None or body is model:
        body = getattr(model, getattr(model, "base_model_prefix", "") or "model", None)
    if head is None or body is None or body is model:
        raise ValueError(f"{name} has no separable LM body and head (get_decoder() / get_output_embeddings())")
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"{name}'s head {type(head).__name__} has no [V, D] weight; got {type(weight).__name__}")
    bias = getattr(head, "bias", None)
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (weight.shape[0],)):
        raise ValueError(f"{name}'s head bias must be a [{weight.shape[0]}] tensor or None, got {bias!r}")
    _refuse_softcap(model, return_softcap)
    scale = _logit_scale(model)
    if scale != 1.0:
        weight = weight * scale
        bias = None if bias is None else bias * scale
    return (body, weight, bias, head_softcap(model)) if return_softcap else (body, weight, bias)


def hidden_and_head(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *, return_softcap: bool = False,
    **body_kwargs,
):  # fmt: skip
    """Run the body of a causal LM; return its final-normed hidden states and the head.

    Args:
        model: as for `lm_body_and_head`.
        input_ids: `[B, T]` token ids. attention_mask: optional `[B, T]`.
        return_softcap: also return the model's final-logit soft-cap, as `lm_body_and_head`.
        **body_kwargs: passed to the body (e.g. `position_ids`, `use_cache=False`).

    Returns:
        (hidden `[B, T, D]`, weight `[V, D]`, bias `[V]` or None[, softcap]); position t of hidden predicts
        token t + 1.
    """
    _refuse_softcap(model, return_softcap)
    body, weight, bias = lm_body_and_head(model, return_softcap=True)[:3]
    out = body(input_ids=input_ids, attention_mask=attention_mask, **body_kwargs)
    hidden = getattr(out, "last_hidden_state", None)
    if hidden is None:
        raise ValueError(f"the body of {type(model).__name__} returned no last_hidden_state")
    return (hidden, weight, bias, head_softcap(model)) if return_softcap else (hidden, weight, bias)
