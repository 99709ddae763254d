"""The eval options: every flag reaches the config, bad values and combinations are refused naming the value, the
eval sets are named and loaded as documented, the schedule, and an eval that leaves every generator as it was."""

import json
import random

import numpy
import pytest
import torch

from fastrl.trainer import evaluation
from fastrl.trainer.cli import main, parse_config
from fastrl.trainer.config import ConfigError, make_config
from fastrl.trainer.eval_options import EvalSet, eval_due, eval_temperature, parse_eval_sets
from fastrl.trainer.eval_sets import training_prompts
from fastrl.trainer.preflight import build_reward
from fastrl.trainer.tasks import load_problems
from fastrl.trainer.tiny import CharTokenizer, tiny_model

ON = dict(eval_dataset="arithmetic-heldout:19", eval_every=5)


def test_every_eval_flag_reaches_the_config():
    flags = ["--eval-dataset", "a=arithmetic:9,arithmetic-trained", "--eval-dataset-split", "validation",
             "--eval-every", "20", "--eval-before-train", "--eval-samples", "4", "--eval-temperature", "0.7",
             "--eval-max-problems", "32"]  # fmt: skip
    config, _ = parse_config(["train", "--preset", "tiny", *flags])
    got = {k: getattr(config, k) for k in ("eval_dataset", "eval_dataset_split", "eval_every", "eval_before_train",
                                           "eval_samples", "eval_temperature", "eval_max_problems")}  # fmt: skip
    assert got == dict(eval_dataset="a=arithmetic:9,arithmetic-trained", eval_dataset_split="validation",
                       eval_every=20, eval_before_train=True, eval_samples=4, eval_temperature=0.7,
                       eval_max_problems=32)  # fmt: skip
    assert parse_config(["train", "--preset", "tiny", "--eval-temperature", "none"])[0].eval_temperature is None
    assert make_config("tiny").eval_every == 0 and make_config().eval_dataset == ""  # off unless asked for


@pytest.mark.parametrize(
    "options, field, value",
    [
        (dict(eval_every=5), "eval_every", 5),  # nothing to evaluate on
        (dict(eval_before_train=True), "eval_before_train", True),
        (dict(eval_dataset="arithmetic:9"), "eval_dataset", "arithmetic:9"),  # never evaluated
        (dict(ON, eval_every=-1), "eval_every", -1),
        (dict(ON, eval_samples=0), "eval_samples", 0),
        (dict(ON, eval_max_problems=-3), "eval_max_problems", -3),
        (dict(ON, eval_temperature=1e-9), "eval_temperature", 1e-9),
        (dict(ON, eval_temperature=0.0, eval_samples=4), "eval_temperature", 0.0),  # greedy, four times
        (dict(ON, eval_dataset="arithmetic-heldout:9"), "eval_dataset", "arithmetic-heldout:9"),  # all trained
        (dict(ON, eval_dataset="arithmetic-heldout"), "eval_dataset", "arithmetic-heldout"),
        (dict(ON, eval_dataset="arithmetic-trained:9"), "eval_dataset", "arithmetic-trained:9"),
        (dict(ON, eval_dataset="arithmetics:9"), "eval_dataset", "arithmetics:9"),
        (dict(ON, eval_dataset="a=arithmetic:9,a=arithmetic-trained"), "eval_dataset",
         "a=arithmetic:9,a=arithmetic-trained"),  # two sets, one name
        (dict(ON, eval_dataset="bad name=x.jsonl"), "eval_dataset", "bad name=x.jsonl"),
        (dict(ON, dataset="problems.jsonl", warmup_sft_steps=0), "eval_dataset", "arithmetic-heldout:19"),
    ],
    ids=["every-no-set", "before-no-set", "set-never-run", "every<0", "samples<1", "max-problems<0", "temp-tiny",
         "greedy-k4", "heldout-trained", "heldout-no-n", "trained-n", "typo", "same-name", "bad-name", "not-arith"],
)  # fmt: skip
def test_bad_values_and_combinations_are_refused_naming_the_value(options, field, value):
    with pytest.raises(ConfigError) as e:
        make_config("tiny", **options)
    assert e.value.field == field and e.value.value == value, str(e.value)


def test_the_cli_names_the_flag_and_exits_2(capsys):
    assert main(["train", "--preset", "tiny", "--eval-every", "10"]) == 2
    assert "--eval-every 10: needs eval_dataset" in capsys.readouterr().err


def test_eval_sets_are_named_by_their_source_unless_named():
    assert parse_eval_sets("") == []
    assert parse_eval_sets("arithmetic-heldout:19") == [EvalSet(None, "arithmetic-heldout:19")]  # one set: eval_*
    assert parse_eval_sets("held=arithmetic-heldout:19") == [EvalSet("held", "arithmetic-heldout:19")]
    sets = parse_eval_sets("arithmetic-heldout:19, data/my test.jsonl ,org/math-500,x=arithmetic-trained")
    assert [s.name for s in sets] == ["arithmetic-heldout-19", "my-test", "math-500", "x"]


def test_the_schedule_every_n_after_the_last_and_step_zero():
    config = make_config("tiny", max_steps=45, **ON)
    assert [s for s in range(46) if eval_due(s, config)] == [5, 10, 15, 20, 25, 30, 35, 40, 45]
    config = make_config("tiny", max_steps=12, eval_dataset="arithmetic:9", eval_every=5, eval_before_train=True)
    assert [s for s in range(13) if eval_due(s, config)] == [0, 5, 10, 12]


def test_the_temperature_is_greedy_at_one_sample_and_the_training_one_above():
    assert eval_temperature(make_config("tiny", temperature=0.8, **ON)) == 0.0
    assert eval_temperature(make_config("tiny", temperature=0.8, eval_samples=4, **ON)) == 0.8
    assert eval_temperature(make_config("tiny", temperature=0.8, eval_samples=4, eval_temperature=0.5, **ON)) == 0.5


def test_the_sets_load_as_documented(tmp_path):
    config = make_config("tiny", eval_every=5, eval_max_problems=40,
                         eval_dataset="h=arithmetic-heldout:19,t=arithmetic-trained,f=arithmetic:9")  # fmt: skip
    sets = evaluation.load_eval_sets(config)
    seen = training_prompts(config.dataset, config.seed)
    assert [len(v) for v in sets.values()] == [40, 40, 40]
    assert not {p.prompt for p in sets["h"]} & seen and len({p.prompt for p in sets["h"]}) == 40
    assert {p.prompt for p in sets["t"]} <= seen and len({p.prompt for p in sets["t"]}) == 40
    fresh, trained = sets["f"], load_problems("arithmetic:9", config.seed)[:40]
    assert fresh != trained and all(int(p.answer) == eval(p.prompt[:-1]) for p in fresh)  # draws of their own
    assert len(evaluation.load_eval_sets(make_config("tiny", eval_every=5, eval_dataset="arithmetic:9"))[None]) == 256
    whole = evaluation.load_eval_sets(make_config("tiny", eval_every=5, eval_dataset="arithmetic-heldout:12"))
    assert len(whole[None]) == 13 * 13 - len([p for p in seen if max(map(int, p[:-1].split("+"))) <= 12])
    (tmp_path / "e.jsonl").write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    assert (
        len(evaluation.load_eval_sets(make_config("tiny", eval_every=5, eval_dataset=str(tmp_path / "e.jsonl")))[None])
        == 1
    )
    with pytest.raises(ConfigError) as e:
        evaluation.load_eval_sets(make_config("tiny", eval_every=5, eval_dataset=str(tmp_path / "missing.jsonl")))
    assert e.value.field == "eval_dataset" and "missing.jsonl" in e.value.value


def _states():
    return random.getstate(), numpy.random.get_state()[1].tolist(), torch.random.get_rng_state()


def test_an_eval_leaves_every_generator_as_it_was_and_writes_its_step(tmp_path, monkeypatch):
    """Sampled eval (k = 4) on a tiny model: Python's, NumPy's and torch's generators are where they were; the
    row's metrics are those of the per-problem file; the same step evaluates the same way twice."""
    config = make_config("tiny", output_dir=str(tmp_path), eval_every=5, eval_samples=4, eval_max_problems=6,
                         eval_dataset="arithmetic-heldout:19")  # fmt: skip
    tokenizer = CharTokenizer()
    run = type("Run", (), {"model": tiny_model(len(tokenizer), 32, 1, max_len=64, seed=0), "tokenizer": tokenizer})
    evaluator = evaluation.Evaluator(config, build_reward(config), evaluation.load_eval_sets(config), run)
    random.seed(1), numpy.random.seed(2), torch.manual_seed(3)
    before = _states()
    first = evaluator.evaluate(run, 5)
    after = _states()
    assert after[0] == before[0] and after[1] == before[1] and torch.equal(after[2], before[2])
    rows = [json.loads(line) for line in (tmp_path / "eval" / "step-5.jsonl").read_text().splitlines()]
    assert [r["problem_id"] for r in rows] == [str(i) for i in range(6)] and all(
        len(r["completions"]) == 4 for r in rows
    )
    assert first["eval_pass@1"] == pytest.approx(sum(sum(r["correct"]) for r in rows) / 24)
    assert first["eval_reward_mean"] == pytest.approx(sum(sum(r["rewards"]) for r in rows) / 24)
    assert first["eval_version"] == 5 and {"eval_pass@4", "eval_maj@4", "eval_time_s"} <= set(first)
    assert {k: v for k, v in evaluator.evaluate(run, 5).items() if k != "eval_time_s"} == {
        k: v for k, v in first.items() if k != "eval_time_s"
    }


def test_an_eval_of_a_tool_run_samples_with_its_tools():
    """A policy trained to call tools is evaluated with them: the eval engine runs the run's tools, the same way."""
    config = make_config("tiny", eval_every=5, eval_dataset="arithmetic:9", tools="python", max_tool_calls=2,
                         tool_timeout_s=3.0)  # fmt: skip
    tokenizer = CharTokenizer()
    run = type("Run", (), {"model": tiny_model(len(tokenizer), 32, 1, max_len=64, seed=0), "tokenizer": tokenizer})
    turns = evaluation.Evaluator(config, build_reward(config), {}, run).hf.tools
    assert turns is not None and turns.max_calls == 2 and turns.timeout_s == 3.0
