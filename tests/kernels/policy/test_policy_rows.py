"""`policy_rows` at the kernel level: the Triton path (under the interpreter) against the PyTorch path.

Every `STATS` column the Triton kernel writes must equal the PyTorch path's column of the same name, with
every option on, on ragged masks and rows longer than one kernel block. The Triton outputs start as NaN,
so a column the kernel does not write fails.
"""

import dataclasses

import pytest
import torch

from fastrl.kernels import NUM_STATS, STATS, PolicyLossParams, configs, policy_rows
from fastrl.kernels.policy.fwd import policy_fwd_kernel
from fastrl.kernels.policy.params import STAT_CONSTEXPRS

ALL_ON = PolicyLossParams(
    eps_low=0.2, eps_high=0.28, dual_clip=1.5, beta=0.05, kl="k3", kl_clip=None, kl_bias_correction=False,
    entropy_coef=0.01, pg="clip", sapo_tau_pos=1.0, sapo_tau_neg=1.05, ratio_level="token",
)  # fmt: skip


def make_rows(B, T, seed, per_token_adv):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g) * 3
    old = logp + 0.5 * torch.randn(B, T, generator=g)
    ref = logp + 0.3 * torch.randn(B, T, generator=g)
    weight = torch.exp(0.3 * torch.randn(B, T, generator=g)).clamp(max=1.2)  # a truncated IS weight
    entropy = torch.rand(B, T, generator=g) * 2
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = 0
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.randn((B, T) if per_token_adv else (B,), generator=g)
    return logp, adv, mask, old, ref, weight, entropy


def run(impl, rows, params):
    logp, adv, mask, old, ref, weight, entropy = rows
    logp, entropy = logp.clone().requires_grad_(True), entropy.clone().requires_grad_(True)
    row_loss, stats = policy_rows(logp, adv, mask, old, ref, weight, entropy, params, impl=impl)
    (row_loss * torch.linspace(0.5, 1.5, row_loss.shape[0])).sum().backward()
    return row_loss.detach(), stats, logp.grad, entropy.grad


CASES = [
    pytest.param(ALL_ON, 5, 37, False, id="token-B5-T37-adv_row"),
    pytest.param(dataclasses.replace(ALL_ON, ratio_level="sequence"), 5, 37, True, id="sequence-B5-T37-adv_token"),
    pytest.param(dataclasses.replace(ALL_ON, kl="k2", dual_clip=None), 3, 64, True, id="token-k2-nodual-B3-T64"),
    pytest.param(
        dataclasses.replace(ALL_ON, ratio_level="sequence-token", kl="k3+", kl_clip=2.0, kl_bias_correction=True),
        5,
        37,
        True,
        id="sequence_token-k3plus-clip-bias-B5-T37",
    ),  # fmt: skip
    pytest.param(
        dataclasses.replace(
            ALL_ON, pg="sapo", dual_clip=None, kl="abs", kl_bias_correction=True, ratio_level="sequence"
        ),
        4,
        33,
        False,
        id="sapo-abs-bias-sequence-B4-T33",
    ),  # fmt: skip
    pytest.param(dataclasses.replace(ALL_ON, pg="linear", dual_clip=None, kl="k1+"), 4, 33, True, id="linear-k1plus"),
]


@pytest.mark.parametrize("params, B, T, per_token", CASES)
@pytest.mark.parametrize("max_block", [None, 16], ids=["one_block", "blocks16"])
def test_triton_stats_columns_equal_torch_by_name(params, B, T, per_token, max_block, monkeypatch):
    if max_block is not None:
        monkeypatch.setattr(configs, "POLICY_MAX_BLOCK_T", max_block)
    rows = make_rows(B, T, seed=B * T, per_token_adv=per_token)
    loss_t, stats_t, g_t, ge_t = run("torch", rows, params)
    loss_k, stats_k, g_k, ge_k = run("triton", rows, params)
    assert stats_t.shape == stats_k.shape == (B, NUM_STATS)
    for i, name in enumerate(STATS):
        torch.testing.assert_close(stats_k[:, i], stats_t[:, i], rtol=1e-5, atol=1e-6, msg=name)
    # the batch binds every clip on the token path, so the clip columns are not trivially 0 == 0
    if params.ratio_level == "token" and params.pg == "clip":
        for name in ("clip_low", "clip_high"):
            assert stats_t[:, STATS.index(name)].sum() > 0, name
    torch.testing.assert_close(loss_k, loss_t, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_k, g_t, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ge_k, ge_t, rtol=1e-5, atol=1e-6)


def test_stat_indices_come_from_stats_and_are_all_stored_by_the_kernel():
    assert list(STAT_CONSTEXPRS.values()) == list(range(len(STATS)))
    assert [k.removeprefix("STAT_").lower() for k in STAT_CONSTEXPRS] == list(STATS)
    kernel_stats = {a for a in policy_fwd_kernel.fn.arg_names if a.startswith("STAT_")}
    assert kernel_stats == set(STAT_CONSTEXPRS)


def test_unknown_kl_estimator_policy_term_and_ratio_level_are_rejected():
    with pytest.raises(ValueError, match="'k4'"):
        dataclasses.replace(ALL_ON, kl="k4")
    with pytest.raises(ValueError, match="'ppo'"):
        dataclasses.replace(ALL_ON, pg="ppo")
    with pytest.raises(ValueError, match="'seq'"):
        dataclasses.replace(ALL_ON, ratio_level="seq")


def test_unknown_impl_is_rejected_naming_it():
    rows = make_rows(2, 4, seed=0, per_token_adv=False)
    with pytest.raises(ValueError, match="'cuda'"):
        policy_rows(*rows, ALL_ON, impl="cuda")
