"""verl's actor micro-batch step on CPU: fused forward + policy loss + entropy term + backward, with verl's
own torch backend and "vanilla" loss vs fastrl's backend and loss_mode="fastrl"; same loss and gradients.

Runs where verl is installed (`.ci/verl.sh` builds that environment).
"""

import copy

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from verl.models.transformers.monkey_patch import patch_forward_with_backends  # noqa: E402
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn  # noqa: E402

from fastrl.integrations.verl import VERL_FORWARDS, forward_with_fastrl_backend  # noqa: E402

B, P, R, V = 3, 5, 7, 97


def _model():
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).float()


def _step(model, loss_mode, mode, batch):
    input_ids, attention_mask, old, adv, response_mask = batch
    out = model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True, temperature=0.7)
    log_prob = out.log_probs[:, P - 1 : -1]  # position t scores token t + 1: the R response tokens
    entropy = out.entropy[:, P - 1 : -1]
    config = OmegaConf.create(
        {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
         "global_batch_info": {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None,
                               "loss_scale_factor": None}}
    )  # fmt: skip
    pg_loss, metrics = get_policy_loss_fn(loss_mode)(
        old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=response_mask, loss_agg_mode=mode,
        config=config,
    )  # fmt: skip
    loss = pg_loss - 0.01 * agg_loss(entropy, response_mask, mode, **config.global_batch_info)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), log_prob.detach(), entropy.detach().float(), grads, metrics


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_fastrl_backend_and_loss_match_verl(mode):
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, V, (B, P + R), generator=g)
    attention_mask = torch.ones(B, P + R, dtype=torch.long)
    response_mask = torch.rand(B, R, generator=g) < 0.8
    old = -torch.rand(B, R, generator=g) * 4 - 2
    adv = torch.randn(B, 1, generator=g).expand(B, R).contiguous()
    batch = (input_ids, attention_mask, old, adv, response_mask)
    cls, base = Qwen2ForCausalLM, _model()
    original = cls.forward
    try:
        cls.forward = VERL_FORWARDS["torch"]
        ref = _step(copy.deepcopy(base), "vanilla", mode, batch)
        cls.forward = original
        ours_model = copy.deepcopy(base)
        patch_forward_with_backends(ours_model, use_fused_kernels=True, fused_kernels_backend="torch")
        assert cls.forward is forward_with_fastrl_backend, "verl did not install fastrl's backend"
        ours = _step(ours_model, "fastrl", mode, batch)
    finally:
        cls.forward = original
    for a, b in zip(ref[:3], ours[:3]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert ref[3].keys() == ours[3].keys()
    for name, grad in ref[3].items():
        torch.testing.assert_close(ours[3][name], grad, rtol=1e-5, atol=1e-7, msg=name)
    assert ours[4] == pytest.approx(ref[4], rel=1e-6)
