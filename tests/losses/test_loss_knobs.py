"""One declaration per loss knob: `LossConfig` → `PolicyLossParams` by one function; one metric vocabulary."""

import dataclasses

import pytest
import torch
from test_policy_loss import full_config, make_batch

from fastrl import LossConfig, policy_loss
from fastrl.kernels import PolicyLossParams
from fastrl.losses import METRIC_KEYS
from fastrl.losses.policy import _kernel_params

# A value other than the default for every LossConfig field the kernel takes.
NON_DEFAULT = dict(eps_low=0.1, eps_high=0.3, dual_clip=2.5, beta=0.04, kl="k2", entropy_coef=0.02, is_cap=3.0)


def test_every_kernel_field_but_seq_ratio_is_a_loss_config_field():
    config_fields = {f.name for f in dataclasses.fields(LossConfig)}
    kernel_fields = {f.name for f in dataclasses.fields(PolicyLossParams)}
    assert kernel_fields - config_fields == {"seq_ratio"}
    assert set(NON_DEFAULT) == kernel_fields - {"seq_ratio"}


@pytest.mark.parametrize("name", sorted(NON_DEFAULT))
def test_each_knob_reaches_the_kernel_params(name):
    default, changed = _kernel_params(LossConfig()), _kernel_params(LossConfig(**{name: NON_DEFAULT[name]}))
    assert getattr(changed, name) == NON_DEFAULT[name] != getattr(default, name)
    others = [f.name for f in dataclasses.fields(PolicyLossParams) if f.name != name]
    assert all(getattr(changed, f) == getattr(default, f) for f in others)


def test_ratio_level_sets_seq_ratio_and_numbers_become_floats():
    np = pytest.importorskip("numpy")
    params = _kernel_params(LossConfig(ratio_level="sequence", eps_low=np.float32(0.25), beta=1, is_cap=2))
    assert params.seq_ratio is True and _kernel_params(LossConfig()).seq_ratio is False
    assert type(params.eps_low) is float and type(params.beta) is float and type(params.is_cap) is float
    assert params.eps_low == pytest.approx(0.25) and params.beta == 1.0 and params.is_cap == 2.0


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_metric_names_are_exactly_metric_keys(impl):
    b = make_batch(dtype=torch.float32)
    full = policy_loss(
        b["logp"], b["adv"], b["mask"], old_logprobs=b["old"], ref_logprobs=b["ref"],
        rollout_logprobs=b["rollout"], entropy=b["entropy"], config=full_config("token-mean", "token", "k3"),
        impl=impl,
    )  # fmt: skip
    assert set(full.metrics) == set(METRIC_KEYS) | {"num_tokens"}
    plain = policy_loss(b["logp"], b["adv"], b["mask"], old_logprobs=b["old"], impl=impl)
    optional = {"clip_frac_dual", "kl_mean", "entropy_mean", "is_weight_mean"}
    assert set(plain.metrics) == (set(METRIC_KEYS) - optional) | {"num_tokens"}
