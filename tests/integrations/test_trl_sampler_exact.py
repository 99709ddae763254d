"""`FastRLGRPOTrainer(sampler_exact=True)` scores GRPOConfig's top-k / top-p / min-p distribution (docs/math.md §8);
the default stays TRL's full softmax. On TRL's real trainer, built on CPU."""

import pytest
import torch
import trl_harness as h
from datasets import Dataset

import fastrl
from fastrl.integrations.trl import FastRLGRPOTrainer


def _build(tmp_path, sampler_exact, **overrides):
    args = h.config(tmp_path, **overrides)
    data = Dataset.from_dict({"prompt": h.PROMPTS})
    return FastRLGRPOTrainer(model=h.model(), reward_funcs=h.reward, args=args, train_dataset=data,
                             processing_class=h.tokenizer(), sampler_exact=sampler_exact)  # fmt: skip


@pytest.mark.parametrize("sampler_exact", [False, True], ids=["trl-exact", "sampler-exact"])
def test_head_scores_the_configured_distribution(tmp_path, sampler_exact):
    trainer = _build(tmp_path, sampler_exact, top_k=10, top_p=0.9, temperature=0.8)
    net = trainer.model
    ids = torch.randint(3, 64, (2, 9))
    out = net(input_ids=ids, labels=ids, fused_lm_head=True)
    hidden = net.model(input_ids=ids).last_hidden_state[:, :-1]
    opts = dict(top_k=10, top_p=0.9) if sampler_exact else {}
    logp, ent = fastrl.token_logprobs(hidden, net.lm_head.weight, ids[:, 1:], temperature=0.8, return_entropy=True,
                                      **opts)  # fmt: skip
    torch.testing.assert_close(out.log_probs, logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.entropy, ent, rtol=1e-5, atol=1e-5)
    full = fastrl.token_logprobs(hidden, net.lm_head.weight, ids[:, 1:], temperature=0.8)
    assert torch.equal(out.log_probs.isclose(full, rtol=1e-5, atol=1e-5).all(), torch.tensor(not sampler_exact))


def test_sampler_exact_refuses_an_order_it_cannot_match(tmp_path):
    with pytest.raises(ValueError, match="min_p=0.1 and top_p=0.9"):
        _build(tmp_path, True, top_p=0.9, min_p=0.1)
    with pytest.raises(ValueError, match="generation_kwargs"):
        _build(tmp_path, True, generation_kwargs={"top_k": 5})
    _build(tmp_path, False, top_p=0.9, min_p=0.1)  # TRL-exact: the loss is the full softmax whatever was sampled
