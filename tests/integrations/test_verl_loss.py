"""`loss_mode="fastrl"` against verl's real "vanilla" policy loss: same loss, gradient and metrics.

Runs where verl is installed (`.ci/verl.sh` builds that environment).
"""

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.ppo.core_algos import get_policy_loss_fn  # noqa: E402

import fastrl.integrations.verl  # noqa: E402,F401  (registers loss_mode="fastrl")

MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def _inputs(seed=0, b=6, t=37):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    logp = (old + 0.4 * torch.randn(b, t, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(b, 1, generator=g, dtype=torch.float64).expand(b, t).contiguous()
    mask = torch.rand(b, t, generator=g) < 0.8
    mask[2] = False  # a sequence with no live token
    weights = torch.rand(b, t, generator=g, dtype=torch.float64) * 2
    return old, logp, adv, mask, weights


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch_info", [{}, {"dp_size": 2, "batch_num_tokens": 300, "global_batch_size": 11}])
@pytest.mark.parametrize("with_weights", [False, True], ids=["no-is", "is"])
def test_matches_verl_vanilla(mode, batch_info, with_weights):
    config = OmegaConf.create(
        {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
         "global_batch_info": {"loss_scale_factor": None, **batch_info}}
    )  # fmt: skip
    results = []
    for name in ("vanilla", "fastrl"):
        old, logp, adv, mask, weights = _inputs()
        loss, metrics = get_policy_loss_fn(name)(
            old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, loss_agg_mode=mode,
            config=config, rollout_is_weights=weights if with_weights else None,
        )  # fmt: skip
        loss.backward()
        results.append((loss.detach(), logp.grad, metrics))
    (ref_loss, ref_grad, ref_metrics), (loss, grad, metrics) = results
    torch.testing.assert_close(loss.double(), ref_loss.double(), rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-9)
    assert metrics.keys() == ref_metrics.keys()
    for key, value in ref_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
