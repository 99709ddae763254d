"""Empty rows and batches, garbage under the mask, and every input error."""

import pytest
import torch
from test_policy_loss import IMPLS, full_config, make_batch

from fastrl import LossConfig, policy_loss
from fastrl.losses.config import AGG_MODES


def _call(b, cfg, impl, **over):
    kw = dict(
        old_logprobs=b["old"],
        ref_logprobs=b["ref"],
        rollout_logprobs=b["rollout"],
        entropy=b["entropy"],
        config=cfg,
        impl=impl,
    )
    kw.update(over)
    return policy_loss(b["logp"], b["adv"], b["mask"], **kw)


def _with_grads(b):
    b = dict(b)
    b["logp"] = b["logp"].clone().requires_grad_(True)
    b["entropy"] = b["entropy"].clone().requires_grad_(True)
    return b


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", AGG_MODES)
def test_all_zero_batch_gives_exact_zero(mode, level, impl):
    b = _with_grads(make_batch(dtype=torch.float32, per_token_adv=True))
    b["mask"] = torch.zeros_like(b["mask"])
    out = _call(b, full_config(mode, level, "k3"), impl)
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert torch.equal(b["logp"].grad, torch.zeros_like(b["logp"]))
    assert torch.equal(b["entropy"].grad, torch.zeros_like(b["entropy"]))
    assert all(torch.isfinite(v).all() for v in out.metrics.values())
    assert out.metrics["num_tokens"] == 0


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_garbage_under_the_mask_changes_nothing(level, impl):
    clean = _with_grads(make_batch(dtype=torch.float32, per_token_adv=True))
    dirty = _with_grads(make_batch(dtype=torch.float32, per_token_adv=True))
    off = ~clean["mask"]
    with torch.no_grad():
        for key, junk in (("logp", float("-inf")), ("old", float("nan")), ("ref", 1e30), ("rollout", float("-inf"))):
            dirty[key][off] = junk
        dirty["entropy"][off] = float("nan")
        dirty["adv"][off] = float("inf")
    cfg = full_config("seq-mean-token-mean", level, "k3")
    a, b = _call(clean, cfg, impl), _call(dirty, cfg, impl)
    a.loss.backward()
    b.loss.backward()
    assert torch.isfinite(b.loss)
    torch.testing.assert_close(b.loss, a.loss, rtol=0, atol=0)
    torch.testing.assert_close(dirty["logp"].grad, clean["logp"].grad, rtol=0, atol=0)
    torch.testing.assert_close(dirty["entropy"].grad, clean["entropy"].grad, rtol=0, atol=0)
    assert torch.equal(clean["logp"].grad[off], torch.zeros_like(clean["logp"].grad[off]))
    for key in a.metrics:
        torch.testing.assert_close(b.metrics[key], a.metrics[key], rtol=0, atol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_empty_sequence_contributes_zero(impl):
    b = make_batch(dtype=torch.float32)  # row 1 has an all-zero mask
    cfg = full_config("seq-mean-token-sum", "sequence", "k3")
    base = _call(b, cfg, impl).loss
    keep = [0, 2, 3]
    sub = {k: v[keep] for k, v in b.items()}
    # the empty row still counts in the default normalizer (B), as in TRL and verl
    torch.testing.assert_close(_call(sub, cfg, impl, normalizer=4).loss, base, rtol=1e-6, atol=0)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.float32, torch.float16])
def test_mask_dtypes_agree(mask_dtype):
    b = make_batch(dtype=torch.float32)
    cfg = LossConfig(loss_agg="grpo", is_cap=1.5)
    ref = _call(b, cfg, "torch").loss
    torch.testing.assert_close(_call(dict(b, mask=b["mask"].to(mask_dtype)), cfg, "torch").loss, ref)


def _errors():
    b = make_batch(dtype=torch.float32)
    T = b["logp"].shape[1]
    return [
        ("beta=0.1", dict(config=LossConfig(beta=0.1), ref_logprobs=None)),
        ("is_cap=2.0", dict(config=LossConfig(is_cap=2.0), rollout_logprobs=None)),
        ("is_cap is None", dict(config=LossConfig())),
        ("entropy_coef=0.01", dict(config=LossConfig(entropy_coef=0.01), entropy=None, rollout_logprobs=None)),
        ("old_logprobs shape", dict(old_logprobs=b["old"][:, :-1])),
        ("ref_logprobs dtype", dict(ref_logprobs=b["ref"].double())),
        ("entropy must be a torch.Tensor", dict(entropy=[1.0])),
        ("config must be a LossConfig", dict(config={"beta": 0})),
        ("normalizer must be a finite count", dict(normalizer=-1)),
        ("normalizer must be a number", dict(normalizer="8")),
        ("normalizer tensor", dict(normalizer=torch.ones(2))),
        ("impl must be one of", dict(impl="cuda")),
        ("advantages must be", dict(advantages=torch.zeros(T))),
        ("advantages must be a floating", dict(advantages=torch.zeros(4, dtype=torch.int64))),
        ("mask must hold only 0 and 1, found 2", dict(mask=b["mask"].long() * 2)),
        ("mask shape", dict(mask=b["mask"][:2])),
        ("logprobs must be [B, T]", dict(logprobs=b["logp"][0])),
        ("logprobs must be a floating", dict(logprobs=b["logp"].long())),
    ]


@pytest.mark.parametrize("match,over", _errors(), ids=[e[0] for e in _errors()])
def test_bad_inputs_raise_naming_the_value(match, over):
    b = make_batch(dtype=torch.float32)
    args = dict(logprobs=b["logp"], advantages=b["adv"], mask=b["mask"])
    kw = dict(
        old_logprobs=b["old"],
        ref_logprobs=b["ref"],
        rollout_logprobs=b["rollout"],
        entropy=b["entropy"],
        config=LossConfig(is_cap=1.5),
        impl="torch",
    )
    for key in list(over):
        (args if key in args else kw)[key] = over[key]
    with pytest.raises((ValueError, TypeError), match=match.replace("[", r"\[").replace("]", r"\]")):
        policy_loss(args["logprobs"], args["advantages"], args["mask"], **kw)


def test_device_mismatch_is_reported():
    b = make_batch(dtype=torch.float32)
    with pytest.raises(ValueError, match="meta"):
        policy_loss(b["logp"], b["adv"], b["mask"], old_logprobs=b["old"].to("meta"), impl="torch")


@pytest.mark.parametrize(
    "fields,match",
    [
        (dict(loss_agg="mean"), "'mean'"),
        (dict(loss_agg=3), "loss_agg must be a str"),
        (dict(eps_low=-0.1), "eps_low must be >= 0, got -0.1"),
        (dict(eps_low=1.0), "eps_low must be < 1"),
        (dict(eps_high=float("nan")), "eps_high must be finite"),
        (dict(dual_clip=1.0), "dual_clip must be None or > 1, got 1.0"),
        (dict(beta=-1), "beta must be >= 0, got -1"),
        (dict(beta="0.1"), "beta must be a float"),
        (dict(kl="low_var_kl"), "'low_var_kl'"),
        (dict(temperature=0.0), r"temperature must be a finite number >= 1e-06 \(MIN_TEMPERATURE.*got 0.0"),
        (dict(ratio_level="seq"), "'seq'"),
        (dict(loss_agg="dr_grpo"), "loss_agg='dr_grpo'.*max_completion_length"),
        (dict(max_completion_length=0), "max_completion_length must be None or a positive int, got 0"),
        (dict(is_cap=0), "is_cap must be None or > 0, got 0"),
        (dict(entropy_coef=None), "entropy_coef must be a float"),
        (dict(pg_loss="ppo"), "pg_loss"),
        (dict(is_mode="clip", is_cap=2.0), "is_mode"),
        (dict(is_min=0.5), "is_min=0.5 needs is_cap"),
        (dict(is_min=3.0, is_cap=2.0), "is_min must be in"),
        (dict(top_entropy_quantile=0.0), "top_entropy_quantile"),
        (dict(kl_clip=-1.0), "kl_clip"),
        (dict(pg_loss="cispo", eps_low=1.5), "cispo"),
        (dict(rejection=(("token_k1", None, 2.0),)), "token_k1"),
        (dict(rejection=(("seq_mean_k3", 0.1, 2.0),)), "seq_mean_k3"),
        (dict(rejection=(("token_k9", None, 2.0),)), "token_k9"),
        (dict(rejection="token_k1"), "rejection"),
    ],
)
def test_config_validation(fields, match):
    with pytest.raises((ValueError, TypeError), match=match):
        LossConfig(**fields)


def test_config_aliases_and_frozen():
    assert LossConfig(loss_agg="grpo").loss_agg == "seq-mean-token-mean"
    assert LossConfig(loss_agg="bnpo").loss_agg == "token-mean"
    assert LossConfig(loss_agg="dapo").loss_agg == "token-mean"
    assert LossConfig(loss_agg="dr_grpo", max_completion_length=8).loss_agg == "seq-mean-token-sum-norm"
    with pytest.raises(AttributeError):
        LossConfig().beta = 1.0
