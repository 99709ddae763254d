"""The README drop-in on a tiny Hugging Face Llama with tied embeddings: same loss and gradients as eager."""

import torch
import transformers

from fastrl import GRPOLoss, policy_loss


def _tiny_llama():
    cfg = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).float()


def test_body_hidden_plus_lm_head_matches_eager_logits():
    model = _tiny_llama()
    assert model.lm_head.weight is model.get_input_embeddings().weight
    B, P, C = 3, 4, 6
    ids = torch.randint(0, 97, (B, P + C))
    mask = torch.ones(B, C, dtype=torch.bool)
    mask[1, 4:] = False
    adv = torch.tensor([1.0, -0.5, 0.3])
    old = -4.6 + 0.2 * torch.randn(B, C)
    ref = old + 0.1 * torch.randn(B, C)
    loss_fn = GRPOLoss(loss_agg="grpo", eps_high=0.28, beta=0.04, temperature=0.7, entropy_coef=0.01, impl="torch")

    hidden = model.get_decoder()(input_ids=ids).last_hidden_state[:, P - 1 : -1]
    out = loss_fn(hidden, model.lm_head.weight, ids[:, P:], mask, adv, old_logprobs=old, ref_logprobs=ref)
    out.loss.backward()
    fused = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    full = model(input_ids=ids, output_hidden_states=True)
    logits = full.logits[:, P - 1 : -1].float() / 0.7
    logq = torch.log_softmax(logits, -1)
    lp = logq.gather(-1, ids[:, P:, None])[..., 0]
    ent = -(logq.exp() * logq).sum(-1)
    eager = policy_loss(lp, adv, mask, old_logprobs=old, ref_logprobs=ref, entropy=ent, config=loss_fn.config)
    eager.loss.backward()

    torch.testing.assert_close(out.loss, eager.loss, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(fused[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)
    # the docs' alternative: the full call with logits_to_keep=1 gives the same final-normed hidden states
    short = model(input_ids=ids, output_hidden_states=True, logits_to_keep=1)
    assert short.logits.shape[1] == 1
    torch.testing.assert_close(short.hidden_states[-1][:, P - 1 : -1], hidden)
