"""`FastRLGRPOTrainer` with a PEFT LoRA adapter against TRL's real `GRPOTrainer` with the same adapter (peft).

With PEFT and beta != 0 TRL has no reference model: it scores the reference with the adapters disabled, through
the same patched forward, so the logged `kl` equal to stock's says fastrl's reference pass is the adapter-free
model. The head is frozen: fastrl's kernel is asked for no d_weight (no [V, D] gradient, no d_weight GEMM).
"""

import math

import pytest
import torch
import trl_harness as h
from peft import LoraConfig
from trl import GRPOTrainer

from fastrl.integrations.trl import FastRLGRPOTrainer

FP32_TOL = 1e-5


def lora(*targets):
    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=list(targets), task_type="CAUSAL_LM")


@pytest.mark.parametrize("steps_per_generation", [pytest.param(4, id="off-policy"), pytest.param(2, id="on-policy")])
def test_lora_matches_stock_trl_with_peft(tmp_path, steps_per_generation, monkeypatch):
    from fastrl.kernels.fused_loss import api
    from fastrl.kernels.logprobs import chunked

    asked = []  # (d_hidden wanted, d_weight wanted) of every head gradient formed
    backward, fused = chunked.chunked_backward, api.fused_forward

    inside = []  # chunked_backward calls itself on the live rows: record the outer call alone

    def recorded(*args):
        if not inside:
            asked.append(args[-1][:2])  # needs = (d_hidden, d_weight, -, d_bias)
        inside.append(True)
        try:
            return backward(*args)
        finally:
            inside.pop()

    def recorded_fused(*args):  # the gradient-in-forward pass: params.needs = (d_hidden, d_weight, d_bias)
        asked.append(args[-1].needs[:2])
        return fused(*args)

    monkeypatch.setattr(chunked, "chunked_backward", recorded)
    monkeypatch.setattr(api, "fused_forward", recorded_fused)
    fields = dict(optim="sgd", beta=0.1, learning_rate=0.5, steps_per_generation=steps_per_generation)
    peft = lora("q_proj", "v_proj", "gate_proj")
    stock = h.run(GRPOTrainer, h.config(tmp_path / "a", **fields), h.model(), peft_config=peft)
    ours = h.run(FastRLGRPOTrainer, h.config(tmp_path / "b", **fields), h.model(), peft_config=peft)
    (logs_a, params_a), (logs_b, params_b) = stock, ours
    assert asked and all(needs[0] and not needs[1] for needs in asked), asked
    assert len(logs_a) == len(logs_b) == 4 and all(entry["kl"] > 0 for entry in logs_a[1:-1])
    for step, (a, b) in enumerate(zip(logs_a, logs_b)):
        assert a.keys() == b.keys(), (step, a.keys() ^ b.keys())
        for key, value in a.items():
            if isinstance(value, float):
                assert math.isclose(value, b[key], rel_tol=FP32_TOL, abs_tol=1e-7), (step, key, value, b[key])
    lora_b = [n for n in params_a if "lora_B" in n]
    update = max(params_a[n].abs().max().item() for n in lora_b)  # lora_B starts at zero
    assert update > 1e-3, "the adapter did not train"
    diff = max((params_a[n] - params_b[n]).abs().max().item() for n in params_a)
    assert diff <= FP32_TOL * update, (diff, update)


@pytest.mark.parametrize("how", ["peft_config", "peft_model"])
def test_lora_on_the_head_is_refused_at_construction(tmp_path, how):
    """An adapter on lm_head would be skipped by a fused head that reads lm_head.weight: the trainer refuses it,
    naming lm_head, whether it comes as `peft_config` or as a PeftModel (TRL's own check, which it inherits)."""
    from peft import get_peft_model

    net, peft = h.model(), lora("q_proj", "lm_head")
    kwargs = {"peft_config": peft} if how == "peft_config" else {}
    net = net if how == "peft_config" else get_peft_model(net, peft)
    with pytest.raises(ValueError, match="lm_head"):
        FastRLGRPOTrainer(
            model=net, reward_funcs=h.reward, args=h.config(tmp_path, optim="sgd"), train_dataset=None,
            processing_class=h.tokenizer(), **kwargs,
        )  # fmt: skip


def test_frozen_head_gets_no_gradient(tmp_path):
    from peft import get_peft_model

    from fastrl.integrations.trl import add_fastrl_lm_head

    net = get_peft_model(h.model(), lora("q_proj"))
    add_fastrl_lm_head(net.get_base_model())
    ids = torch.randint(3, 64, (2, 9))
    out = net(input_ids=ids, labels=ids, fused_lm_head=True)
    out.log_probs.sum().backward()
    head = net.get_base_model().lm_head.weight
    assert not head.requires_grad and head.grad is None
    assert all(p.grad is not None for n, p in net.named_parameters() if "lora_" in n)
