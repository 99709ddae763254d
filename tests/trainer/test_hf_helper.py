"""`fastrl.lm_body_and_head` / `hidden_and_head` on tiny Hugging Face models built in memory: the returned
hidden states and head give the model's own logits (tied, untied with bias, Cohere and Granite logit
scales), the fused loss through them matches the eager loss and gradients, and soft-capped or unknown
logit transforms are refused."""

import pytest
import torch
import transformers

import fastrl
from fastrl import GRPOLoss, hidden_and_head, lm_body_and_head, policy_loss

SMALL = dict(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip


def _model(cls, cfg_cls, **kw):
    torch.manual_seed(0)
    return cls(cfg_cls(**{**SMALL, **kw})).float().eval()


def _llama(**kw):
    return _model(transformers.LlamaForCausalLM, transformers.LlamaConfig, **kw)


def _untied_with_bias():
    model = _llama(tie_word_embeddings=False)
    model.lm_head = torch.nn.Linear(32, 61, bias=True)
    torch.nn.init.normal_(model.lm_head.bias, std=0.5)
    return model


MODELS = {
    "llama-tied": lambda: _llama(tie_word_embeddings=True),
    "llama-untied-bias": _untied_with_bias,
    "cohere-logit-scale": lambda: _model(transformers.CohereForCausalLM, transformers.CohereConfig, logit_scale=0.25),
    "granite-logits-scaling": lambda: _model(
        transformers.GraniteForCausalLM, transformers.GraniteConfig, logits_scaling=4.0, tie_word_embeddings=True
    ),
}


def test_public_names():
    assert fastrl.lm_body_and_head is fastrl.losses.lm_body_and_head is lm_body_and_head
    assert fastrl.hidden_and_head is fastrl.losses.hidden_and_head is hidden_and_head


@pytest.mark.parametrize("name", list(MODELS))
def test_hidden_and_head_reproduce_the_model_logits(name):
    model = MODELS[name]()
    ids = torch.randint(0, 61, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    with torch.no_grad():
        hidden, weight, bias = hidden_and_head(model, ids, attention_mask=mask)
        want = model(input_ids=ids, attention_mask=mask).logits
    got = hidden @ weight.T + (0 if bias is None else bias)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if name == "llama-tied":
        assert weight is model.get_input_embeddings().weight and bias is None
    if name == "llama-untied-bias":
        assert weight is model.lm_head.weight and bias is model.lm_head.bias


@pytest.mark.parametrize("name", ["llama-tied", "cohere-logit-scale", "granite-logits-scaling"])
def test_fused_loss_through_the_helper_matches_eager(name):
    model = MODELS[name]()
    B, P, C = 3, 3, 5
    ids = torch.randint(0, 61, (B, P + C))
    mask = torch.ones(B, C)
    mask[2, 3:] = 0
    adv = torch.tensor([1.0, -0.7, 0.4])
    old = -4.1 + 0.2 * torch.randn(B, C)
    loss_fn = GRPOLoss(loss_agg="grpo", eps_high=0.28, temperature=0.7, impl="torch")

    hidden, weight, bias = hidden_and_head(model, ids)
    out = loss_fn(hidden[:, P - 1 : -1], weight, ids[:, P:], mask, adv, bias=bias, old_logprobs=old)
    out.loss.backward()
    fused = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)

    logq = torch.log_softmax(model(input_ids=ids).logits[:, P - 1 : -1].float() / 0.7, -1)
    eager = policy_loss(logq.gather(-1, ids[:, P:, None])[..., 0], adv, mask, old_logprobs=old, config=loss_fn.config)
    eager.loss.backward()
    torch.testing.assert_close(out.loss, eager.loss, rtol=1e-5, atol=1e-6)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(fused) == set(grads)
    for n, g in grads.items():
        torch.testing.assert_close(fused[n], g, rtol=1e-4, atol=1e-6, msg=n)


def test_soft_capped_logits_are_refused():
    model = _model(transformers.Gemma2ForCausalLM, transformers.Gemma2Config, final_logit_softcapping=30.0,
                   head_dim=8)  # fmt: skip
    with pytest.raises(ValueError, match="final_logit_softcapping=30.0"):
        lm_body_and_head(model)


def test_unknown_logits_scaling_is_refused():
    model = _llama()
    model.config.logits_scaling = 2.0  # a field whose meaning differs between families
    with pytest.raises(ValueError, match=r"logits_scaling=2.0 and model_type='llama'"):
        lm_body_and_head(model)


def test_module_without_a_head_is_refused():
    with pytest.raises(ValueError, match="LlamaModel has no separable LM body and head"):
        lm_body_and_head(_llama().model)
