"""The Triton fold / ∂z epilogue against float64 autograd through log_softmax, on one uneven tile."""

import pytest
import torch

from fastrl.kernels.fused_loss.epilogue import fold_dz, fold_stats


def _reference(z, targets, tau, g, g_entropy):
    z64 = z.double().requires_grad_()
    logq = torch.log_softmax(z64 / tau, dim=-1)
    logp = logq.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logq.exp() * logq).sum(-1)
    lse = torch.logsumexp(z64.detach() / tau, dim=-1)
    loss = (g.double() * logp).sum() + (0 if g_entropy is None else (g_entropy.double() * entropy).sum())
    (dz,) = torch.autograd.grad(loss, z64)
    return lse, logp.detach(), entropy.detach(), dz


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["dz-fp32", "dz-bf16"])
@pytest.mark.parametrize("entropy_grad", [False, True], ids=["no-entropy-grad", "entropy-grad"])
@pytest.mark.parametrize("per_row", [False, True], ids=["tau-float", "tau-rows"])
def test_fold_and_dz_match_float64(per_row, entropy_grad, out_dtype):
    g = torch.Generator().manual_seed(0)
    c, v = 7, 1001
    z = 4 * torch.randn(c, v, generator=g)
    z[3, 5] = 60.0  # a row dominated by one logit
    targets = torch.randint(0, v, (c,), generator=g)
    targets[3] = 5
    tau_rows = 0.5 + torch.rand(c, generator=g)
    tau = tau_rows.unsqueeze(-1).double() if per_row else 0.7
    tau_arg = tau_rows if per_row else 0.7
    up = torch.randn(c, generator=g)
    up_h = torch.randn(c, generator=g) if entropy_grad else None
    stats = fold_stats(z, targets, tau_arg, True)
    lse, logp, entropy = stats.row_max + stats.log_sum, stats.logp, stats.entropy
    want_lse, want_logp, want_entropy, want_dz = _reference(z, targets, tau, up, up_h)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(logp.double(), want_logp, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(entropy.double(), want_entropy, rtol=1e-5, atol=1e-5)
    out = torch.full((c, v), float("nan"), dtype=out_dtype)
    fold_dz(z, out, targets, tau_arg, stats, up, up_h)
    # no worse than eager float32 autograd's own error (plus a small slack), or bf16 rounding of ∂z
    z32 = z.clone().requires_grad_()
    logq = torch.log_softmax(z32 / (tau.float() if per_row else tau), dim=-1)
    loss32 = (up * logq.gather(-1, targets.unsqueeze(-1)).squeeze(-1)).sum()
    if entropy_grad:
        loss32 = loss32 + (up_h * -(logq.exp() * logq).sum(-1)).sum()
    (eager_dz,) = torch.autograd.grad(loss32, z32)
    eager_err = (eager_dz.double() - want_dz).abs().max().item()
    if out_dtype == torch.float32:
        assert (out.double() - want_dz).abs().max().item() <= 2 * eager_err + 1e-6
    else:
        torch.testing.assert_close(out.double(), want_dz, rtol=1e-2, atol=1e-4)
    *_, no_entropy = fold_stats(z, targets, tau_arg, False)
    assert no_entropy is None


def test_dz_in_place_on_the_tile():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(5, 300, generator=g)
    targets = torch.randint(0, 300, (5,), generator=g)
    up = torch.randn(5, generator=g)
    stats = fold_stats(z, targets, 1.0, False)
    separate = fold_dz(z, torch.empty_like(z), targets, 1.0, stats, up, None)
    in_place = fold_dz(z, z, targets, 1.0, stats, up, None)
    assert in_place is z
    torch.testing.assert_close(in_place, separate, rtol=0, atol=0)
