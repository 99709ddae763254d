"""`loss_config_from_verl` / `loss_config_from_trl` input forms and errors, and the peers' normalizers, without
the peers' code (tests/peers compares the losses with TRL's and verl's own)."""

import types

import omegaconf
import pytest
import torch

from fastrl import LossConfig
from fastrl.integrations import loss_config_from_verl, trl_normalizer, verl_normalizer
from fastrl.integrations.trl_compat import TRL_LOSS_TYPES
from fastrl.losses import Normalizer
from fastrl.losses.config import TRL_ALIASES

VERL_ACTOR = {
    "loss_agg_mode": "seq-mean-token-mean",
    "clip_ratio": 0.2,
    "clip_ratio_low": None,
    "clip_ratio_high": 0.28,
    "clip_ratio_c": 3.0,
    "use_kl_loss": True,
    "kl_loss_coef": 0.01,
    "kl_loss_type": "low_var_kl",
    "policy_loss": {"loss_mode": "vanilla"},
}


def test_loss_config_from_verl_takes_a_dict_or_an_omegaconf_node():
    node = omegaconf.OmegaConf.create(VERL_ACTOR)
    a, b = loss_config_from_verl(VERL_ACTOR), loss_config_from_verl(node)
    assert a == b
    assert (a.eps_low, a.eps_high, a.dual_clip, a.kl, a.kl_clip, a.beta) == (0.2, 0.28, 3.0, "k3", 10.0, 0.01)
    assert a.count_empty_rows is False and a.loss_agg == "seq-mean-token-mean"


def test_loss_config_from_verl_maps_rollout_correction():
    cfg = loss_config_from_verl(
        VERL_ACTOR,
        rollout_correction=dict(
            rollout_is="sequence", rollout_is_threshold="0.5_4", rollout_rs="token_k1,seq_max_k3",
            rollout_rs_threshold="2.0,0.3",
        ),
    )  # fmt: skip
    assert (cfg.is_level, cfg.is_mode, cfg.is_min, cfg.is_cap, cfg.is_log_clip) == ("sequence", "mask", 0.5, 4.0, 20.0)
    assert cfg.rejection == (("token_k1", 0.5, 2.0), ("seq_max_k3", None, 0.3))


def test_loss_config_from_verl_names_every_unsupported_option_at_once():
    actor = dict(VERL_ACTOR, policy_loss={"loss_mode": "kl_cov"}, kl_loss_type="full")
    with pytest.raises(ValueError, match="kl_cov") as err:
        loss_config_from_verl(actor, rollout_correction={"rollout_is_batch_normalize": True, "bypass_mode": True})
    for name in ("kl_loss_type='full'", "rollout_is_batch_normalize", "bypass_mode"):
        assert name in str(err.value)


def _trl_args(**over):
    fields = dict(loss_type="dapo", gradient_accumulation_steps=4, steps_per_generation=2)
    return types.SimpleNamespace(**(fields | over))


def test_trl_aliases_of_loss_config_agree_with_the_loss_type_table():
    # LossConfig(loss_agg="dapo") names TRL's aggregations; the table of TRL's loss types is the reference
    assert TRL_ALIASES and all(TRL_LOSS_TYPES[name].loss_agg == agg for name, agg in TRL_ALIASES.items())


@pytest.mark.parametrize(
    "loss_type, expected",
    [("grpo", 3 * 4), ("sapo", 3 * 4), ("dr_grpo", 3 * 4), ("luspo", 3 * 4), ("bnpo", 5 * 4), ("dapo", 40 / 2 * 4 / 2)],
)
def test_trl_normalizer(loss_type, expected):
    mask = torch.zeros(3, 4, dtype=torch.bool)
    mask[0, :3] = mask[1, :2] = True
    norm = trl_normalizer(_trl_args(loss_type=loss_type), mask, num_items_in_batch=torch.tensor(40), num_processes=2)
    assert isinstance(norm, Normalizer) and norm.accumulation_steps == 4
    assert float(norm.policy) == expected


def test_trl_normalizer_eval_and_missing_items():
    mask = torch.ones(2, 3, dtype=torch.bool)
    assert float(trl_normalizer(_trl_args(), mask, num_items_in_batch=6, training=False).policy) == 6
    with pytest.raises(ValueError, match="num_items_in_batch"):
        trl_normalizer(_trl_args(loss_type="cispo"), mask)
    with pytest.raises(ValueError, match="top_entropy_quantile"):  # TRL's quantile spans the processes
        trl_normalizer(_trl_args(top_entropy_quantile=0.2), mask, num_items_in_batch=6, num_processes=2)


def test_verl_normalizer():
    tm, seq, ts = (LossConfig(loss_agg=a) for a in ("token-mean", "seq-mean-token-mean", "token-sum"))
    assert verl_normalizer(tm, dp_size=2, batch_num_tokens=100, global_batch_size=8).policy == 50
    assert verl_normalizer(seq, dp_size=2, batch_num_tokens=100, global_batch_size=8).policy == 4
    assert verl_normalizer(ts, dp_size=4).policy == 0.25
    assert verl_normalizer(seq).policy is None
    with pytest.raises(ValueError, match="global_batch_size"):
        verl_normalizer(seq, dp_size=2)
    with pytest.raises(ValueError, match="dp_size"):
        verl_normalizer(seq, dp_size=0)
