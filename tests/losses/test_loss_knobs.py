"""One declaration per loss knob: `LossConfig` → `PolicyLossParams` by one function; one metric vocabulary."""

import dataclasses

import numpy as np
import pytest
import torch
from test_policy_loss import full_config, make_batch

from fastrl import LossConfig, policy_loss
from fastrl.kernels import PolicyLossParams
from fastrl.losses import METRIC_KEYS
from fastrl.losses.policy import kernel_params

# A value other than the default for every LossConfig field the kernel takes.
NON_DEFAULT = dict(
    eps_low=0.1, eps_high=0.3, dual_clip=2.5, beta=0.04, kl="k2", kl_clip=4.0, kl_bias_correction=True,
    entropy_coef=0.02, sapo_tau_pos=2.0, sapo_tau_neg=3.0, ratio_level="sequence-token",
)  # fmt: skip


def test_every_kernel_field_but_pg_is_a_loss_config_field():
    config_fields = {f.name for f in dataclasses.fields(LossConfig)}
    kernel_fields = {f.name for f in dataclasses.fields(PolicyLossParams)}
    assert kernel_fields - config_fields == {"pg"}
    assert set(NON_DEFAULT) == kernel_fields - {"pg"}


@pytest.mark.parametrize(
    "pg_loss, pg", [("clip", "clip"), ("sapo", "sapo"), ("cispo", "linear"), ("gpg", "linear"), ("vespo", "linear")]
)
def test_pg_loss_picks_the_kernel_policy_term_and_drops_the_dual_clip_off_clip(pg_loss, pg):
    params = kernel_params(LossConfig(pg_loss=pg_loss, dual_clip=2.0))
    assert params.pg == pg and params.dual_clip == (2.0 if pg == "clip" else None)


def test_token_mean_entropy_bonus_stays_out_of_the_kernel():
    assert kernel_params(LossConfig(entropy_coef=0.1, entropy_agg="token-mean")).entropy_coef == 0.0


@pytest.mark.parametrize("name", sorted(NON_DEFAULT))
def test_each_knob_reaches_thekernel_params(name):
    default, changed = kernel_params(LossConfig()), kernel_params(LossConfig(**{name: NON_DEFAULT[name]}))
    assert getattr(changed, name) == NON_DEFAULT[name] != getattr(default, name)
    others = [f.name for f in dataclasses.fields(PolicyLossParams) if f.name != name]
    assert all(getattr(changed, f) == getattr(default, f) for f in others)


def test_numbers_become_floats():
    params = kernel_params(LossConfig(ratio_level="sequence", eps_low=np.float32(0.25), beta=1, kl_clip=2))
    assert params.ratio_level == "sequence" and kernel_params(LossConfig()).ratio_level == "token"
    assert type(params.eps_low) is float and type(params.beta) is float and type(params.kl_clip) is float
    assert params.eps_low == pytest.approx(0.25) and params.beta == 1.0 and params.kl_clip == 2.0


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_metric_names_are_exactly_metric_keys(impl):
    b = make_batch(dtype=torch.float32)
    full = policy_loss(
        b["logp"], b["adv"], b["mask"], old_logprobs=b["old"], ref_logprobs=b["ref"],
        rollout_logprobs=b["rollout"], entropy=b["entropy"], config=full_config("token-mean", "token", "k3"),
        impl=impl,
    )  # fmt: skip
    weighted = {"vespo_phi_mean", "off_policy_masked_frac", "rejected_frac"}  # those terms' own
    assert set(full.metrics) == set(METRIC_KEYS) - weighted | {"num_tokens"}
    plain = policy_loss(b["logp"], b["adv"], b["mask"], old_logprobs=b["old"], impl=impl)
    optional = {"clip_frac_dual", "kl_mean", "entropy_mean", "is_weight_mean"} | weighted
    assert set(plain.metrics) == (set(METRIC_KEYS) - optional) | {"num_tokens"}
