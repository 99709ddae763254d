import json

import pytest

from fastrl.losses import LossConfig
from fastrl.trainer.cli import main, parse_config
from fastrl.trainer.config import PRESETS, TrainConfig, config_to_dict, make_config
from fastrl.trainer.tasks import PromptStream, arithmetic_problems, load_jsonl
from fastrl.trainer.tiny import CharTokenizer


def test_tokenizer_round_trip_and_markup_tokens():
    tok = CharTokenizer()
    text = "<think>3+4</think>\\boxed{7}"
    ids = tok.encode(text)
    assert len(ids) == 8 and tok.decode(ids) == text
    assert tok.decode(tok.encode(text, add_special_tokens=True) + [tok.eos_token_id]) == text
    with pytest.raises(ValueError, match="'€'"):
        tok.encode("1€")


def test_prompt_stream_resumes_at_its_position():
    problems = arithmetic_problems(7, 9, seed=0)
    a = PromptStream(problems, seed=3)
    first = a.next_batch(5) + a.next_batch(5)
    b = PromptStream(problems, seed=3, position=5)
    assert b.next_batch(5) == first[5:]
    assert sorted(p.prompt for p in first[:7]) == sorted(p.prompt for p in problems)  # one epoch = a permutation


def test_load_jsonl(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"q": "1+1", "a": 2}\n\n{"q": "2+2", "a": "4"}\n')
    assert [(p.prompt, p.answer) for p in load_jsonl(str(path), "q", "a")] == [("1+1", "2"), ("2+2", "4")]
    with pytest.raises(ValueError, match="'answer'"):
        load_jsonl(str(path), "q", "answer")


def test_presets_build_and_precedence(tmp_path):
    for name in PRESETS:
        assert isinstance(make_config(name), TrainConfig)
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("lr: 0.5\nmax_steps: 7\nrewards: [accuracy:1.0]\n")
    cfg, _ = parse_config(["train", "--preset", "tiny", "--config", str(cfg_file), "--max-steps", "9", "--no-progress"])
    assert (cfg.lr, cfg.max_steps, cfg.progress, cfg.rewards) == (0.5, 9, False, ("accuracy:1.0",))
    assert cfg.group_size == PRESETS["tiny"]["group_size"]


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(advantage_scale="zscore"), "'zscore'"),
        (dict(group_size=0), "group_size"),
        (dict(prompts_per_step=6, minibatches=4), "minibatches=4"),
        (dict(warmup_sft_noise=1.5), "1.5"),
        (dict(bogus=1), "bogus"),
    ],
)
def test_bad_config_raises(kw, match):
    with pytest.raises(ValueError, match=match):
        make_config(**kw)


def test_cli_prints_config_and_rejects_bad_values(capsys):
    assert main(["train", "--preset", "math-32k", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["max_completion_length"] == 32768
    assert main(["train", "--preset", "tiny", "--lr", "fast"]) == 2
    assert "--lr fast" in capsys.readouterr().err


def test_train_config_holds_one_loss_config(tmp_path):
    cfg = make_config("math-32k", beta=0.04, kl="k1", temperature=0.7)
    assert isinstance(cfg.loss, LossConfig) and not hasattr(cfg, "eps_high")
    assert (cfg.loss.eps_high, cfg.loss.beta, cfg.loss.kl) == (0.28, 0.04, "k1")  # preset, then overrides
    assert (cfg.loss.temperature, cfg.loss.max_completion_length) == (0.7, 32768)  # the sampler's values
    flat = config_to_dict(cfg)
    assert "loss" not in flat and (flat["eps_high"], flat["beta"], flat["temperature"]) == (0.28, 0.04, 0.7)
    assert make_config(**flat) == cfg  # the flat form round-trips
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("loss:\n  eps_low: 0.1\n  loss_agg: dr_grpo\neps_high: 0.3\n")
    cfg, _ = parse_config(["train", "--config", str(cfg_file), "--beta", "0.2", "--is-cap", "2"])
    assert (cfg.loss.eps_low, cfg.loss.eps_high, cfg.loss.beta, cfg.loss.is_cap) == (0.1, 0.3, 0.2, 2.0)
    assert (
        cfg.loss.loss_agg == "seq-mean-token-sum-norm" and cfg.loss.max_completion_length == cfg.max_completion_length
    )


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(eps_low=1.5), "eps_low must be < 1"),
        (dict(kl="k9"), "'k9'"),
        (dict(loss={"bogus_knob": 1}), "bogus_knob"),
        (
            dict(loss=LossConfig(temperature=0.5), temperature=0.9),
            "loss.temperature=0.5 disagrees with temperature=0.9",
        ),
    ],
)
def test_bad_loss_knobs_raise_when_the_config_is_built(kw, match):
    with pytest.raises(ValueError, match=match):
        make_config(**kw)
