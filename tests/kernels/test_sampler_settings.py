"""`SamplerSettings`: one home for the sampler's five settings, one spelling of off (None), its own checks; and
`LossConfig` reading its sampler keywords through it."""

import dataclasses

import numpy as np
import pytest

from fastrl.kernels import MIN_TEMPERATURE, SamplerSettings
from fastrl.losses import LossConfig

OFF = SamplerSettings()


def test_defaults_are_all_off():
    assert OFF == SamplerSettings(1.0, None, None, None, None)
    assert not OFF.on and not OFF.truncates
    assert OFF.truncation() == {"top_k": None, "top_p": None, "min_p": None}


@pytest.mark.parametrize(
    "legacy",
    [dict(top_k=0), dict(top_k=-1), dict(top_p=1.0), dict(top_p=1), dict(min_p=0.0), dict(min_p=0)],
    ids=lambda d: "-".join(f"{k}={v}" for k, v in d.items()),
)
def test_legacy_off_spellings_are_stored_as_none(legacy):
    assert SamplerSettings(**legacy) == OFF
    assert LossConfig(**legacy).sampler == OFF
    assert all(getattr(LossConfig(**legacy), name) is None for name in legacy)


def test_values_are_kept_and_typed():
    s = SamplerSettings(temperature=np.float32(0.5), top_k=np.int64(7), top_p=0.9, min_p=0.05, softcap=30)
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.softcap) == (0.5, 7, 0.9, 0.05, 30.0)
    assert type(s.top_k) is int and type(s.softcap) is float and type(s.temperature) is float
    assert s.on and s.truncates
    assert SamplerSettings(softcap=5.0).on and not SamplerSettings(softcap=5.0).truncates


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        OFF.top_k = 3


def test_engine_kwargs_spell_off_as_samplers_do():
    assert OFF.engine_kwargs() == {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    s = SamplerSettings(temperature=0.7, top_k=20, top_p=0.95, min_p=0.1)
    assert s.engine_kwargs() == {"temperature": 0.7, "top_k": 20, "top_p": 0.95, "min_p": 0.1}
    assert SamplerSettings(**s.engine_kwargs()) == s  # the engine's numbers read back as the same settings


@pytest.mark.parametrize(
    "bad, error, named",
    [
        (dict(temperature=0.0), ValueError, "0.0"),
        (dict(temperature=MIN_TEMPERATURE / 2), ValueError, str(MIN_TEMPERATURE / 2)),
        (dict(temperature=float("nan")), ValueError, "nan"),
        (dict(temperature="1"), TypeError, "str"),
        (dict(top_k=-2), ValueError, "-2"),
        (dict(top_k=2.0), TypeError, "2.0"),
        (dict(top_k=True), TypeError, "True"),
        (dict(top_p=0.0), ValueError, "0.0"),
        (dict(top_p=1.5), ValueError, "1.5"),
        (dict(top_p="0.9"), TypeError, "'0.9'"),
        (dict(min_p=-0.1), ValueError, "-0.1"),
        (dict(min_p=1.01), ValueError, "1.01"),
        (dict(softcap=0.0), ValueError, "0.0"),
        (dict(softcap=float("inf")), ValueError, "inf"),
        (dict(softcap=False), TypeError, "False"),
    ],
    ids=lambda v: getattr(v, "__name__", None) or ("-".join(f"{k}={v[k]}" for k in v) if isinstance(v, dict) else "v"),
)
def test_bad_values_are_named(bad, error, named):
    (name,) = bad
    for build in (SamplerSettings, LossConfig):
        with pytest.raises(error, match=name) as info:
            build(**bad)
        assert named in str(info.value), str(info.value)


def test_loss_config_sampler_is_its_fields():
    config = LossConfig(temperature=0.8, top_k=5, top_p=0.9, softcap=20.0)
    assert config.sampler == SamplerSettings(0.8, 5, 0.9, None, 20.0)
    assert config.sampler_on and not LossConfig().sampler_on
    assert dataclasses.replace(config, **OFF.as_dict()).sampler == OFF
