"""`FastRLGRPOTrainer` against TRL's real `GRPOTrainer`, end to end on CPU.

Both trainers run 3 optimizer steps (gradient accumulation 2; steps_per_generation 4, so the later
micro-batches are off-policy and clip, or 2, on-policy) from one seed on a tiny random Qwen2; the logged loss
and every logged metric and the trained parameters must agree. The optimizer is SGD: Adam divides by √v,
which turns the rounding noise of gradients that are exactly zero in exact arithmetic (the key-projection
biases: softmax ignores a constant shift) into full-size steps, so an Adam run would compare noise.
"""

import math

import pytest
import torch  # noqa: E402
import trl_harness as h  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from fastrl.integrations.trl import FIELDS, FastRLGRPOTrainer, use_fastrl  # noqa: E402

EDIT_LOOP_CASES = 3  # the edit loop (-m "not slow") runs the first 3 cases of each matrix; CI runs all

FP32_TOL = 1e-5


def _compare(stock, ours, base, *, log_tol, update_tol):
    logs_a, params_a = stock
    logs_b, params_b = ours
    assert len(logs_a) == len(logs_b) > 3
    for step, (a, b) in enumerate(zip(logs_a, logs_b)):
        assert a.keys() == b.keys(), (step, a.keys() ^ b.keys())
        for key, value in a.items():
            if isinstance(value, float):
                assert math.isclose(value, b[key], rel_tol=log_tol, abs_tol=1e-7), (step, key, value, b[key])
            else:
                assert value == b[key], (step, key, value, b[key])
    init = dict(base.named_parameters())
    update = max((params_a[n] - init[n].detach()).abs().max().item() for n in params_a)
    assert update > 1e-5, "the run did not train"
    diff = max((params_a[n] - params_b[n]).abs().max().item() for n in params_a)
    assert diff <= update_tol * update, (diff, update)


LOSS_TYPES = [
    pytest.param(dict(loss_type="grpo"), id="grpo"),
    pytest.param(dict(loss_type="bnpo"), id="bnpo"),
    pytest.param(dict(loss_type="dapo"), id="dapo"),
    pytest.param(dict(loss_type="dr_grpo"), id="dr_grpo"),
    pytest.param(dict(loss_type="luspo", importance_sampling_level="sequence"), id="luspo-gspo"),
    pytest.param(dict(loss_type="grpo", importance_sampling_level="sequence"), id="grpo-gspo"),
    pytest.param(
        dict(loss_type="bnpo", delta=1.5, epsilon_high=0.28, entropy_coef=0.01, top_entropy_quantile=0.5),
        id="bnpo-delta-entropy",
    ),
    pytest.param(dict(loss_type="cispo", epsilon_high=1.1), id="cispo"),
    pytest.param(dict(loss_type="sapo"), id="sapo"),
    pytest.param(dict(loss_type="vespo"), id="vespo"),
    pytest.param(dict(loss_type="dapo", off_policy_mask_threshold=0.0), id="dapo-off-policy-mask"),
]
# steps_per_generation 4 > gradient accumulation 2: the second optimizer step trains on completions of the
# first one's policy (TRL's old_per_token_logps path); 2 = 2: every micro-batch is on-policy (no old log-probs)
POLICIES = [pytest.param(4, id="off-policy"), pytest.param(2, id="on-policy")]


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """The tiny model on disk: with beta != 0 TRL loads the reference model from the policy's path."""
    path = tmp_path_factory.mktemp("model")
    h.model().save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("steps_per_generation", POLICIES)
@pytest.mark.parametrize("overrides", LOSS_TYPES)
def test_matches_grpo_trainer_fp32(tmp_path, saved_model, overrides, steps_per_generation):
    """Every logged metric, KL term included (beta=0.1, TRL's default use_bias_correction_kl=True, which logs the
    ratio-weighted k3). The learning rate moves the policy far enough from the reference and from the sampling
    policy that the ratio-weighted and the plain k3 differ in the third digit."""
    fields = dict(optim="sgd", beta=0.1, learning_rate=0.5, steps_per_generation=steps_per_generation, **overrides)
    stock = h.run(GRPOTrainer, h.config(tmp_path / "a", **fields), saved_model)
    ours = h.run(FastRLGRPOTrainer, h.config(tmp_path / "b", **fields), saved_model)
    assert all("kl" in entry for entry in stock[0][:-1])
    _compare(stock, ours, h.load(saved_model), log_tol=FP32_TOL, update_tol=FP32_TOL)


def test_use_fastrl_on_a_built_trainer_dr_grpo(tmp_path):
    base = h.model()
    stock = h.run(GRPOTrainer, h.config(tmp_path / "a", optim="sgd", loss_type="dr_grpo"), base)
    ours = h.run(GRPOTrainer, h.config(tmp_path / "b", optim="sgd", loss_type="dr_grpo"), base, wrap=use_fastrl)
    _compare(stock, ours, base, log_tol=FP32_TOL, update_tol=FP32_TOL)


# bf16 has an 8-bit mantissa (unit roundoff 2**-8 = 3.9e-3). The forward log-probs match TRL's bit for bit
# (the same bf16 logits tile); the gradients differ by roundings of bf16 tensors that TRL keeps in float32 and
# fastrl rounds (the head's input gradients), i.e. a few units of 2**-8 relative.
BF16_LOG_TOL = 2e-3
BF16_UPDATE_TOL = 2e-2


def test_matches_grpo_trainer_on_trl_defaults_bf16_autocast(tmp_path):
    """GRPOConfig's own defaults: bf16=True (the forward runs under torch.autocast, on CPU too), loss_type
    "dapo", gradient checkpointing. Only the run's size, the device and the optimizer are set (and the
    learning rate: the default 1e-6 moves these weights by less than one float32 ulp)."""

    def config(path):
        return GRPOConfig(
            output_dir=str(path), use_cpu=True, seed=7, max_steps=3, per_device_train_batch_size=2,
            gradient_accumulation_steps=2, steps_per_generation=4, num_generations=4, max_completion_length=8,
            logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, optim="sgd",
            learning_rate=1e-2,
        )  # fmt: skip

    args = config(tmp_path / "a")
    assert args.bf16 and args.loss_type == "dapo" and args.gradient_checkpointing
    base = h.model()
    stock = h.run(GRPOTrainer, args, base)
    ours = h.run(FastRLGRPOTrainer, config(tmp_path / "b"), base)
    _compare(stock, ours, base, log_tol=BF16_LOG_TOL, update_tol=BF16_UPDATE_TOL)


def test_every_grpo_config_field_has_a_treatment():
    import dataclasses

    from transformers import TrainingArguments

    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    own = {f.name for f in dataclasses.fields(GRPOConfig)} - base
    assert own == set(FIELDS), (own - set(FIELDS), set(FIELDS) - own)
    assert set(FIELDS.values()) == {"fastrl", "trl", "refused"}


@pytest.mark.parametrize(
    "overrides, named",
    [
        (dict(use_adaptive_entropy=True), "use_adaptive_entropy=True"),
        (dict(delta=1.1, epsilon_high=0.2), "delta=1.1"),
        (dict(router_aux_loss_coef=0.01), "router_aux_loss_coef=0.01"),
    ],
)
def test_refuses_what_it_cannot_honour_at_construction(tmp_path, overrides, named):
    args = h.config(tmp_path, **overrides)
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        FastRLGRPOTrainer(model=h.model(), reward_funcs=h.reward, args=args, train_dataset=None)


def test_head_patch_leaves_generation_alone():
    from trl.trainer.utils import add_fused_lm_head

    from fastrl.integrations.trl import add_fastrl_lm_head

    net = h.model()
    add_fused_lm_head(net, outputs=("log_probs", "entropy"))
    ids = torch.randint(0, 64, (2, 9))
    plain = net(input_ids=ids).logits
    trl_out = net(input_ids=ids, labels=ids, fused_lm_head=True)
    add_fastrl_lm_head(net)
    assert torch.equal(net(input_ids=ids).logits, plain)
    ours = net(input_ids=ids, labels=ids, fused_lm_head=True)
    torch.testing.assert_close(ours.log_probs, trl_out.log_probs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.entropy, trl_out.entropy, rtol=1e-5, atol=1e-5)
