"""`fastrl train --top-k / --top-p / --min-p`: the sampler's settings reach the loss (docs/math.md §8)."""

import pytest

from fastrl.trainer.cli import parse_config
from fastrl.trainer.config import TrainConfig, make_config
from fastrl.trainer.update import sampler_options


def test_flags_reach_the_loss_config():
    config, _ = parse_config(["train", "--preset", "tiny", "--top-k", "5", "--top-p", "0.9", "--min-p", "0.05"])
    assert (config.top_k, config.top_p, config.min_p) == (5, 0.9, 0.05)
    assert (config.loss.top_k, config.loss.top_p, config.loss.min_p) == (5, 0.9, 0.05)
    assert config.loss.sampler_on
    assert sampler_options(config.loss) == dict(top_k=5, top_p=0.9, min_p=0.05, softcap=None)


def test_defaults_leave_the_loss_plain():
    assert not TrainConfig().loss.sampler_on


@pytest.mark.parametrize("field, value", [("top_k", -1), ("min_p", 1.5), ("top_p", 0.0)])
def test_bad_sampler_values_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        make_config(**{field: value})
