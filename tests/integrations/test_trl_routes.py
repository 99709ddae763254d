"""Which work `FastRLGRPOTrainer` does, not only its result (test_trl_trainer.py compares results with TRL's):

- a token-level loss is formed in the model's forward by the gradient-in-forward pass, with no recomputing
  backward of the head; a sequence-level ratio (GSPO) takes the forward + recomputing-backward path;
- TRL's non-reentrant gradient checkpointing keeps each layer's attention outputs, through every enable TRL makes
  (it enables checkpointing again after each generation), so the backward does not run the attention kernel.
"""

import pytest
import torch
import trl_harness as h
from torch.utils._python_dispatch import TorchDispatchMode

from fastrl.hf import ATTENTION_OPS, keep_attention_outputs
from fastrl.integrations.trl import FastRLGRPOTrainer


@pytest.mark.parametrize(
    "overrides, fused",
    [
        pytest.param(dict(loss_type="dapo"), True, id="dapo-token"),
        pytest.param(dict(loss_type="grpo", beta=0.1), True, id="grpo-kl-token"),
        pytest.param(dict(loss_type="grpo", importance_sampling_level="sequence"), False, id="gspo-sequence"),
    ],
)
def test_token_level_losses_are_formed_in_the_forward(tmp_path, monkeypatch, overrides, fused):
    h.model().save_pretrained(tmp_path / "model")  # beta != 0: TRL loads its reference model from the path
    from fastrl.kernels.fused_loss import api
    from fastrl.kernels.logprobs import chunked

    calls = {"fused": 0, "recompute": 0}
    backward, forward = chunked.chunked_backward, api.fused_forward

    inside = []  # chunked_backward calls itself on the live rows: count the outer call alone

    def recompute(*args):
        calls["recompute"] += not inside
        inside.append(True)
        try:
            return backward(*args)
        finally:
            inside.pop()

    def in_forward(*args):
        calls["fused"] += 1
        return forward(*args)

    monkeypatch.setattr(chunked, "chunked_backward", recompute)
    monkeypatch.setattr(api, "fused_forward", in_forward)
    h.run(FastRLGRPOTrainer, h.config(tmp_path / "run", optim="sgd", **overrides), str(tmp_path / "model"))
    micro_batches = 3 * 2  # max_steps × gradient accumulation
    assert calls == ({"fused": micro_batches, "recompute": 0} if fused else {"fused": 0, "recompute": micro_batches})


class _CountAttention(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func in ATTENTION_OPS
        return func(*args, **(kwargs or {}))


def _one_backward(trainer) -> int:
    """Attention kernel calls of one training micro-batch's forward and backward (2 prompts + completions of 9)."""
    g = torch.Generator().manual_seed(3)
    completions = torch.randint(3, 64, (2, 9), generator=g)
    inputs = {
        "prompt_ids": torch.randint(3, 64, (2, 4), generator=g), "prompt_mask": torch.ones(2, 4, dtype=torch.long),
        "completion_ids": completions, "completion_mask": torch.ones_like(completions),
        "advantages": torch.tensor([1.0, -1.0]), "num_items_in_batch": torch.tensor(18),
    }  # fmt: skip
    trainer.model.train()
    with _CountAttention() as count:
        trainer.compute_loss(trainer.model, inputs).backward()
    return count.calls


@pytest.mark.parametrize("keep", [True, False])
def test_trl_checkpointing_keeps_attention_outputs_through_trl_re_enables(tmp_path, keep):
    net = h.model()
    assert net.config._attn_implementation == "sdpa"
    args = h.config(tmp_path, optim="sgd", activation_checkpointing=True, max_steps=2)
    trainer = FastRLGRPOTrainer(
        model=net, reward_funcs=h.reward, args=args, train_dataset=h.dataset(), processing_class=h.tokenizer(),
        keep_attention_outputs=keep,
    )  # fmt: skip
    trainer.train()  # TRL disables checkpointing to generate, then enables it again with its own kwargs
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in trainer.model.modules() if isinstance(m, GradientCheckpointingLayer)]
    assert all(layer.gradient_checkpointing for layer in layers)
    assert len(layers) == net.config.num_hidden_layers
    for layer in layers:
        assert (layer._gradient_checkpointing_func.keywords.get("context_fn") is keep_attention_outputs) == keep
    # the kernel runs once a layer in the forward; without the policy the backward's recompute runs it again
    assert _one_backward(trainer) == net.config.num_hidden_layers * (1 if keep else 2)


def test_keep_attention_outputs_must_be_a_bool(tmp_path):
    with pytest.raises(TypeError, match="keep_attention_outputs"):
        FastRLGRPOTrainer(
            model=h.model(), reward_funcs=h.reward, args=h.config(tmp_path), train_dataset=h.dataset(),
            processing_class=h.tokenizer(), keep_attention_outputs="yes",
        )  # fmt: skip


def test_head_policy_loss_keeps_the_samplers_truncation():
    """A sampler config reaching `head_policy_loss` directly scores the truncated distribution (never the plain
    softmax, fused or not): its log-probs are `sampled_token_logprobs`' with the same top-k."""
    from fastrl.integrations.trl.head import head_policy_loss
    from fastrl.kernels import sampled_token_logprobs
    from fastrl.losses import LossConfig
    from fastrl.losses.call import PolicyInputs

    model = h.model()
    hidden = torch.randn(2, 5, model.config.hidden_size, requires_grad=True)
    targets = torch.randint(0, model.config.vocab_size, (2, 5))
    mask = torch.ones(2, 5)
    config = LossConfig(top_k=3)
    policy = PolicyInputs(torch.tensor([1.0, -1.0]), mask, None, None, None, config, None, "torch")
    out, logp, _ = head_policy_loss(model, hidden, targets, policy, temperature=0.7, cast_lm_head_to_fp32=False)
    want = sampled_token_logprobs(hidden, model.lm_head.weight, targets, temperature=0.7, top_k=3, impl="torch")
    torch.testing.assert_close(logp, want.logp, rtol=0, atol=1e-6)
    assert "outside_kept_frac" in out.metrics
    out.loss.backward()
    assert hidden.grad is not None and bool(hidden.grad.isfinite().all())
