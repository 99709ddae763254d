import pytest
import torch

from fastrl.trainer.advantages import EPS, group_advantages, zero_std_groups


def test_group_zscore_matches_formula():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.25, 0.0, 1.0])
    got = group_advantages(r, 4, "std")
    for g in range(2):
        x = r[g * 4 : (g + 1) * 4].double()
        want = (x - x.mean()) / (x.std() + EPS)
        torch.testing.assert_close(got[g * 4 : (g + 1) * 4].double(), want, rtol=1e-6, atol=1e-6)


def test_zero_variance_group_gives_zero_not_nan():
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    a = group_advantages(r, 3, "std")
    assert torch.isfinite(a).all()
    assert a[:3].abs().max() == 0
    assert zero_std_groups(r, 3).tolist() == [True, False]


def test_batch_std_and_none():
    r = torch.tensor([1.0, 0.0, 3.0, 1.0])
    centered = torch.tensor([0.5, -0.5, 1.0, -1.0])
    torch.testing.assert_close(group_advantages(r, 2, "none"), centered)
    torch.testing.assert_close(group_advantages(r, 2, "batch-std"), centered / (r.std() + EPS))
    torch.testing.assert_close(group_advantages(r, 2, "batch-std", batch_std=2.0), centered / (2.0 + EPS))


@pytest.mark.parametrize(
    "rewards,g,scale,match",
    [
        (torch.ones(5), 2, "std", "groups of 2"),
        (torch.ones(4), 2, "zscore", "scale"),
        (torch.tensor([1.0, float("nan")]), 2, "std", "finite"),
        (torch.ones(2, 2), 2, "std", "1-D"),
    ],
)
def test_bad_input_raises(rewards, g, scale, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(rewards, g, scale)
