"""fastrl against verl's own actor loss (installed verl, unmodified, in its own environment): every
loss_agg_mode × policy loss × KL type × rollout-correction mode, verl's default actor config, and
3 micro-batches with the mini-batch's global counts (one and two data-parallel ranks).

verl pins a transformers older than the test environment's, so it runs in the venv `.ci/verl.sh`
builds (`FASTRL_VERL_PYTHON` points at its python): one subprocess computes verl's losses and
gradients for all cases, this process computes fastrl's and compares them.
"""

import itertools
import os
import subprocess
import zlib
from pathlib import Path

import pytest
import torch
from parity_data import MICRO_BATCHES, TOL, B, err, make_batch

from fastrl import policy_loss
from fastrl.integrations import loss_config_from_verl, verl_normalizer

pytestmark = pytest.mark.slow  # every test here starts processes (workers, a CLI, a venv)

PEER = Path(__file__).with_name("verl_peer.py")
AGG = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
POLICY = ("vanilla", "gspo", "sapo", "cispo", "gpg")
KL = (None, "kl", "abs", "mse", "low_var_kl", "k3+", "k1+")
CORRECTION = {
    "none": None,
    "token-tis": dict(rollout_is="token", rollout_is_threshold=2.0),
    "seq-tis": dict(rollout_is="sequence", rollout_is_threshold=2.0),
    "token-icepop": dict(rollout_is="token", rollout_is_threshold="0.5_2.0"),
    "seq-icepop": dict(rollout_is="sequence", rollout_is_threshold="0.3_3.0"),
    # rejection sampling, alone and chained with sequence-level IS
    "rs-token-k1": dict(rollout_rs="token_k1", rollout_rs_threshold="0.8_1.25"),
    "rs-seq-mean-k3": dict(rollout_rs="seq_mean_k3", rollout_rs_threshold=0.05),
    "rs-chain-seq-tis": dict(
        rollout_is="sequence",
        rollout_is_threshold=2.0,
        rollout_rs="token_k2,seq_max_k3,seq_sum_k1",
        rollout_rs_threshold="0.05,0.3,0.5_2.0",
    ),  # fmt: skip
}


def actor(agg, policy, kl, entropy):
    fields = dict(loss_agg_mode=agg, clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0,
                  loss_scale_factor=16, entropy_coeff=entropy, tau_pos=1.0, tau_neg=1.05,
                  policy_loss={"loss_mode": policy})  # fmt: skip
    if kl is not None:
        fields.update(use_kl_loss=True, kl_loss_coef=0.05, kl_loss_type=kl)
    return fields


def matrix():
    for i, (agg, policy, kl, corr) in enumerate(itertools.product(AGG, POLICY, KL, CORRECTION)):
        entropy = 0.01 if i % 2 else 0.0
        if policy in ("gspo", "sapo") and agg != "seq-mean-token-mean" and (kl or entropy):
            continue  # verl aggregates these policy terms by sequence but KL and entropy by loss_agg_mode
        if corr.startswith("rs-") and kl not in (None, "low_var_kl"):
            continue
        yield (
            f"{agg}-{policy}-{kl}-{corr}-ent{entropy}",
            dict(actor=actor(agg, policy, kl, entropy), corr=CORRECTION[corr], i=i),
        )


def build_case(spec, b, *, micro_batches=(tuple(range(B)),), global_info=None):
    per_token = spec["i"] % 3 == 0
    adv = b["adv"][:, None].expand(-1, b["logp"].shape[1]).clone()
    if per_token:
        g = torch.Generator().manual_seed(spec["i"])
        adv = adv + 0.2 * torch.randn(adv.shape, generator=g, dtype=adv.dtype)
    case = dict(actor=spec["actor"], rollout_correction=spec["corr"], logp=b["logp"], entropy=b["entropy"],
                mask=b["mask"], adv=adv, old=b["old"], ref=b["ref"], rollout=b["rollout"],
                micro_batches=[list(r) for r in micro_batches])  # fmt: skip
    if global_info:
        case["global"] = global_info
    return case


def run_fastrl(case, *, global_info=None):
    cfg = loss_config_from_verl(case["actor"], rollout_correction=case["rollout_correction"])
    logp = case["logp"].clone().requires_grad_(True)
    entropy = case["entropy"].clone().requires_grad_(True)
    losses = []
    use_rollout = cfg.is_cap is not None or bool(cfg.rejection)
    for rows in case["micro_batches"]:
        norm = verl_normalizer(cfg, **(global_info or {}))
        out = policy_loss(
            logp[rows], case["adv"][rows], case["mask"][rows], old_logprobs=case["old"][rows],
            ref_logprobs=case["ref"][rows], rollout_logprobs=case["rollout"][rows] if use_rollout else None,
            entropy=entropy[rows], config=cfg, normalizer=norm, impl="torch",
        )  # fmt: skip
        losses.append(out.loss)
    sum(losses).backward()
    return torch.stack(losses).detach(), logp.grad, entropy.grad


def run_verl(cases, py):
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"fastrl-verl-{os.getpid()}"
    tmp.mkdir(exist_ok=True)
    torch.save(cases, tmp / "cases.pt")
    subprocess.run([py, str(PEER), "run", str(tmp / "cases.pt"), str(tmp / "out.pt")], check=True, timeout=900)
    return torch.load(tmp / "out.pt", weights_only=False)


CASES = dict(matrix())
GA = {
    f"ga-{name}-dp{dp}": (spec, dp)
    for name, spec in [(n, s) for n, s in CASES.items() if s["i"] % 37 == 0 and "rs-" not in n]
    for dp in (1, 2)
}


def ga_global(case, dp):
    tokens = int(case["mask"].sum())
    return dict(dp_size=dp, batch_num_tokens=tokens * dp, global_batch_size=B * dp)


@pytest.fixture(scope="module")
def verl_results(verl_python):
    cases = {}
    for name, spec in CASES.items():
        b = make_batch("bf16" if spec["i"] % 2 else "fp32", seed=zlib.crc32(name.encode()) % 1000)
        cases[name] = build_case(spec, b)
    for name, (spec, dp) in GA.items():
        b = make_batch("fp32", seed=zlib.crc32(name.encode()) % 1000)
        case = build_case(spec, b, micro_batches=MICRO_BATCHES)
        case["global"] = ga_global(case, dp)
        cases[name] = case
    b = make_batch("fp32", seed=11)
    cases["default"] = build_case(dict(actor=None, corr=None, i=1), b)  # verl fills in its defaults
    results = run_verl(cases, verl_python)
    for key in ("actor", "rollout_correction"):
        cases["default"][key] = results["default"][key]
    return cases, results


def check(cases, results, name):
    case, res = cases[name], results[name]
    assert "error" not in res, (name, res.get("error"))
    losses, g, h = run_fastrl(case, global_info=case.get("global"))
    h_ref = res["grad_entropy"]
    h = torch.zeros_like(case["entropy"]) if h is None else h
    h_ref = torch.zeros_like(case["entropy"]) if h_ref is None else h_ref
    d = (err(losses, torch.stack(res["losses"])), err(g, res["grad_logp"]), err(h, h_ref))
    assert max(d) <= TOL, (name, d)
    return d


@pytest.mark.parametrize("name", list(CASES))
def test_verl_loss_matches(verl_results, name):
    check(*verl_results, name)


@pytest.mark.parametrize("name", list(GA))
def test_verl_gradient_accumulation(verl_results, name):
    """3 micro-batches of a mini-batch, each with verl's global counts via `verl_normalizer`."""
    check(*verl_results, name)


def test_verl_default_config(verl_results):
    """`loss_config_from_verl(<verl's default actor config>)`: vanilla PPO, ε = 0.2, dual clip c = 3, token-mean."""
    cases, results = verl_results
    cfg = loss_config_from_verl(cases["default"]["actor"], rollout_correction=cases["default"]["rollout_correction"])
    assert (cfg.pg_loss, cfg.loss_agg, cfg.eps_low, cfg.eps_high, cfg.dual_clip, cfg.beta, cfg.is_cap) == (
        "clip", "token-mean", 0.2, 0.2, 3.0, 0.0, None,
    )  # fmt: skip
    check(cases, results, "default")


@pytest.mark.parametrize(
    "actor_fields, corr, named",
    [
        (dict(policy_loss={"loss_mode": "geo_mean"}), None, "geo_mean"),
        (dict(policy_loss={"loss_mode": "clip_cov"}), None, "clip_cov"),
        (dict(loss_agg_mode="seq-mean-token-sum-norm"), None, "loss_scale_factor"),
        (dict(use_kl_loss=True, kl_loss_type="full"), None, "kl_loss_type"),
        ({}, dict(rollout_is="token", rollout_is_batch_normalize=True), "rollout_is_batch_normalize"),
        ({}, dict(rollout_rs="token_k1"), "rollout_rs_threshold"),
        (dict(policy_loss={"loss_mode": "gspo"}, use_kl_loss=True), None, "gspo"),
    ],
)
def test_verl_unsupported_raises(actor_fields, corr, named):
    with pytest.raises(ValueError, match=named):
        loss_config_from_verl(actor_fields, rollout_correction=corr)


def test_verl_rejection_cases_reject_some_tokens_but_not_all(verl_results):
    """The rejection-sampling cases exercise verl's masks (so their parity cases can fail)."""
    cases, results = verl_results
    for corr in ("rs-token-k1", "rs-seq-mean-k3", "rs-chain-seq-tis"):
        names = [n for n in cases if f"-{corr}-" in n]
        kept = [int(results[n]["mask"].sum()) for n in names]
        total = [int(cases[n]["mask"].sum()) for n in names]
        assert any(k < t for k, t in zip(kept, total)) and all(k > 0 for k in kept), (corr, kept, total)
