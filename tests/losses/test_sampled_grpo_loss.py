"""grpo_loss / GRPOLoss / LossConfig with the sampler's truncation and soft-cap (docs/math.md §8): the loss is
policy_loss on the truncated log-probs, never the plain (or fused) one, and outside_kept_frac counts the
targets outside the kept set."""

import pytest
import torch

import fastrl
from fastrl import GRPOLoss, LossConfig, grpo_loss, policy_loss
from fastrl.kernels.logprobs.naive import sampled_logprobs_reference

B, T, D, V = 3, 11, 40, 301


def inputs():
    hidden = torch.randn(B, T, D, requires_grad=True)
    weight = (torch.randn(V, D) / D**0.5 * 2).requires_grad_()
    targets = torch.randint(0, V, (B, T))
    mask = torch.rand(B, T) > 0.2
    adv = torch.randn(B)
    old = torch.randn(B, T) * 0.1 - 3
    return hidden, weight, targets, mask, adv, old


@pytest.mark.parametrize(
    "opts", [dict(top_p=0.9), dict(top_k=20), dict(min_p=0.05, top_p=0.8), dict(softcap=2.0, top_k=30)],
    ids=["topp", "topk", "minp-topp", "cap-topk"],
)  # fmt: skip
def test_grpo_loss_is_policy_loss_on_truncated_logprobs(opts):
    hidden, weight, targets, mask, adv, old = inputs()
    config = LossConfig(temperature=0.8, entropy_coef=0.01, **opts)
    out = grpo_loss(hidden, weight, targets, mask, adv, old_logprobs=old, config=config)
    out.loss.backward()
    got = (hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None
    sampler = {k: v for k, v in opts.items() if k != "softcap"}
    logp, ent = fastrl.token_logprobs(hidden, weight, targets.masked_fill(~mask, -100), temperature=0.8,
                                      return_entropy=True, softcap=opts.get("softcap"), **sampler)  # fmt: skip
    ref = policy_loss(logp, adv, mask, old_logprobs=old, entropy=ent, config=config)
    ref.loss.backward()
    torch.testing.assert_close(out.loss, ref.loss, rtol=0, atol=0)
    torch.testing.assert_close(got[0], hidden.grad, rtol=0, atol=0)
    torch.testing.assert_close(got[1], weight.grad, rtol=0, atol=0)
    plain = grpo_loss(hidden, weight, targets, mask, adv, old_logprobs=old, config=LossConfig(temperature=0.8,
                      entropy_coef=0.01))  # fmt: skip
    assert not torch.allclose(plain.loss, out.loss)
    assert "outside_kept_frac" in out.metrics and "outside_kept_frac" not in plain.metrics


def test_outside_kept_frac_counts_masked_targets_outside_the_set():
    hidden, weight, targets, mask, adv, _ = inputs()
    ref = sampled_logprobs_reference(hidden.detach().reshape(-1, D).double(), weight.detach().double(),
                                     targets.reshape(-1), top_k=torch.full((B * T,), 5))  # fmt: skip
    outside = ~ref["kept"].gather(1, targets.reshape(-1, 1)).reshape(B, T)
    assert outside[mask].any()
    out = GRPOLoss(top_k=5)(hidden, weight, targets, mask, adv)
    assert torch.isfinite(out.loss)
    expected = (outside & mask).sum() / mask.sum()
    torch.testing.assert_close(out.metrics["outside_kept_frac"], expected.float())
    out.loss.backward()
    assert torch.isfinite(hidden.grad).all() and torch.isfinite(weight.grad).all()


def test_keywords_override_the_config_and_accept_per_row_tensors():
    hidden, weight, targets, mask, adv, _ = inputs()
    a = grpo_loss(hidden, weight, targets, mask, adv, config=LossConfig(top_p=0.9))
    b = grpo_loss(hidden, weight, targets, mask, adv, config=LossConfig(top_p=0.5), top_p=0.9)
    c = grpo_loss(hidden, weight, targets, mask, adv, top_p=torch.full((B,), 0.9))
    torch.testing.assert_close(a.loss, b.loss, rtol=0, atol=0)
    torch.testing.assert_close(a.loss, c.loss, rtol=0, atol=0)


def test_off_values_keep_the_plain_loss():
    hidden, weight, targets, mask, adv, _ = inputs()
    plain = grpo_loss(hidden, weight, targets, mask, adv)
    off = grpo_loss(hidden, weight, targets, mask, adv, config=LossConfig(top_k=0, top_p=1.0, min_p=0.0))
    assert torch.equal(plain.loss, off.loss) and set(plain.metrics) == set(off.metrics)


@pytest.mark.parametrize(
    "field, value, error",
    [("top_p", 0.0, ValueError), ("top_p", 1.5, ValueError), ("min_p", -0.1, ValueError), ("top_k", 2.5, TypeError),
     ("top_k", True, TypeError), ("softcap", 0.0, ValueError), ("softcap", float("inf"), ValueError)],
)  # fmt: skip
def test_config_rejects_bad_sampler_fields(field, value, error):
    with pytest.raises(error, match=field):
        LossConfig(**{field: value})


def test_soft_capped_model_through_hidden_and_head():
    import transformers

    from fastrl import hidden_and_head

    torch.manual_seed(0)
    cfg = transformers.Gemma2Config(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                    max_position_embeddings=64, final_logit_softcapping=3.0)  # fmt: skip
    model = transformers.Gemma2ForCausalLM(cfg).float().eval()
    ids = torch.randint(0, 61, (2, 9))
    with pytest.raises(ValueError, match="return_softcap=True"):
        hidden_and_head(model, ids)
    hidden, weight, bias, cap = hidden_and_head(model, ids, return_softcap=True)
    assert cap == 3.0
    logp = fastrl.token_logprobs(hidden[:, :-1], weight, ids[:, 1:], bias=bias, softcap=cap)
    logits = model(ids).logits[:, :-1].float()
    assert logits.abs().max() < cap  # the model's own logits are capped
    eager = logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(logp, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opts", [{}, dict(top_p=0.9)], ids=["plain", "topp"])
def test_bf16_hidden_with_a_float32_head(opts):
    hidden, weight, targets, mask, adv, old = inputs()
    h16 = hidden.detach().bfloat16().requires_grad_()
    out = grpo_loss(h16, weight, targets, mask, adv, old_logprobs=old, **opts)
    out.loss.backward()
    assert h16.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.float32
    got_w = weight.grad.clone()
    weight.grad = None
    h32 = h16.detach().float().requires_grad_()  # what the float32 head computes
    ref = grpo_loss(h32, weight, targets, mask, adv, old_logprobs=old, **opts)
    ref.loss.backward()
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got_w, weight.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(h16.grad, h32.grad.bfloat16(), rtol=0, atol=0)


def test_config_temperature_has_the_kernels_floor():
    # LossConfig(temperature=1e-7) used to build and then fail in the kernel
    with pytest.raises(ValueError, match="MIN_TEMPERATURE"):
        LossConfig(temperature=1e-7)
    assert LossConfig(temperature=1e-6).temperature == 1e-6


@pytest.mark.parametrize("options", [dict(top_k=5), dict(top_p=0.8, softcap=4.0)], ids=["top-k", "top-p-cap"])
def test_the_router_sends_a_sampler_config_to_the_sampled_path(options, monkeypatch):
    # a config with the sampler on never takes the gradient-in-forward pass, even with a gradient to form
    from fastrl.losses import route

    g = torch.Generator().manual_seed(3)
    b, t, d, v = 2, 6, 8, 37
    hidden, weight = torch.randn(b, t, d, generator=g), torch.randn(v, d, generator=g) * 0.5
    targets, mask = torch.randint(0, v, (b, t), generator=g), torch.ones(b, t, dtype=torch.bool)
    adv, old = torch.tensor([1.0, -0.5]), -torch.rand(b, t, generator=g) - 1
    config = LossConfig(**options)
    assert config.sampler_on and not route.fusable_loss(config, old)
    taken = []
    monkeypatch.setattr(route, "route", lambda call, pick=route.route: taken.append(pick(call)) or taken[-1])
    leaves = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
    got = grpo_loss(*leaves, targets, mask, adv, old_logprobs=old, config=config, impl="torch")
    got.loss.backward()
    assert taken == ["sampled"]
    plain = grpo_loss(hidden, weight, targets, mask, adv, old_logprobs=old, impl="torch")
    assert taken == ["sampled", "plain"]
    assert not torch.allclose(got.loss, plain.loss)  # the truncation matters here
    assert "outside_kept_frac" in got.metrics
