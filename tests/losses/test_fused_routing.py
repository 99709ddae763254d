"""grpo_loss with the added loss terms equals the two-pass composition token_logprobs -> policy_loss, whichever
path (gradient-in-forward or recompute) its routing picks for them (docs/math.md §2, §7)."""

import pytest
import torch
from test_fused_loss import _kwargs, make_inputs

from fastrl import LossConfig, grpo_loss, policy_loss, token_logprobs
from fastrl.losses.route import wants_fused

CONFIGS = {
    # per-token once the constants are known: the gradient-in-forward path
    "bias-corrected-kl": (LossConfig(loss_agg="grpo", beta=0.04, kl_bias_correction=True), True),
    "sapo": (LossConfig(pg_loss="sapo", beta=0.02), True),
    "gpg": (LossConfig(pg_loss="gpg"), True),
    "kl-abs-clip": (LossConfig(beta=0.1, kl="abs", kl_clip=0.05), True),
    "seq-is-mask": (LossConfig(is_cap=1.5, is_min=0.7, is_level="sequence", is_mode="mask"), True),
    "non-empty-rows": (LossConfig(loss_agg="seq-mean-token-mean", count_empty_rows=False, entropy_coef=0.01), True),
    # terms that read the current log-probs or change the mask: the recompute path
    "cispo": (LossConfig(pg_loss="cispo", eps_high=4.0), False),
    "vespo": (LossConfig(pg_loss="vespo"), False),
    "off-policy-mask": (LossConfig(off_policy_mask=0.05, is_cap=2.0), False),
    "entropy-quantile": (LossConfig(top_entropy_quantile=0.5), False),
    "entropy-token-mean": (LossConfig(entropy_coef=0.01, entropy_agg="token-mean"), False),
    "gspo-token": (LossConfig(ratio_level="sequence-token"), False),
}


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_added_terms_match_the_two_pass_path(name, impl):
    cfg, fused = CONFIGS[name]
    x = make_inputs()
    x["mask"][1, :] = False  # an empty row, for the non-empty-row normalizer
    kwargs, adv = _kwargs(x, cfg)
    if cfg.off_policy_mask is not None:
        kwargs["rollout_logprobs"] = x["rollout"].float()
    leaves = [x[k].float().clone().requires_grad_(True) for k in ("hidden", "weight", "bias")]
    assert wants_fused(*leaves, cfg, kwargs["old_logprobs"], kwargs["rollout_logprobs"]) is fused
    out = grpo_loss(leaves[0], leaves[1], x["targets"], x["mask"], adv, bias=leaves[2], impl=impl, **kwargs)
    out.loss.backward()
    got = [t.grad.clone() for t in leaves]

    ref_leaves = [x[k].float().clone().requires_grad_(True) for k in ("hidden", "weight", "bias")]
    need_h = cfg.entropy_coef != 0 or cfg.top_entropy_quantile < 1
    targets = torch.where(x["mask"], x["targets"], -100)
    res = token_logprobs(*ref_leaves[:2], targets, bias=ref_leaves[2], return_entropy=need_h, impl="torch")
    logp, ent = res if need_h else (res, None)
    want = policy_loss(logp, adv, x["mask"], entropy=ent, impl="torch", **kwargs)
    want.loss.backward()
    torch.testing.assert_close(out.loss, want.loss, rtol=1e-5, atol=1e-6)
    for g, leaf in zip(got, ref_leaves):
        torch.testing.assert_close(g, leaf.grad, rtol=1e-4, atol=1e-5)
