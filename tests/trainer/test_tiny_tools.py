"""The tiny-tools preset: its tokenizer's own markup (every plain tiny id unchanged), the products task, the warm-up's
tool demonstrations, and a short fixed-seed run that learns to use the python tool (and does not without it)."""

import random

import pytest

import fastrl.trainer.build as build
import fastrl.trainer.warmup as warmup
from fastrl.tools import ToolResult
from fastrl.trainer.batching import Sample
from fastrl.trainer.config import make_config
from fastrl.trainer.metrics import read_metrics
from fastrl.trainer.rollout.tool_turns import tool_turns_of
from fastrl.trainer.tasks import load_problems, product_problems
from fastrl.trainer.tiny import CharTokenizer, tiny_tokenizer
from fastrl.trainer.tiny.warmup import tool_demonstration
from fastrl.trainer.trainer import train
from fastrl.trainer.validate import ConfigError

CI_STEPS = 20  # the CI run: the preset's warm-up and 20 steps, about 2 minutes on 2 idle cores
TOOLS_MARKUP = ("```python\n", "```output\n", "```")
# the plain tiny vocabulary, as checkpoints and exported models hold it
PLAIN = (
    ["<pad>", "<bos>", "<eos>", "<think>", "</think>", "\\boxed{"]
    + list("0123456789+-*/=()[]{}<>.,:;?!'\"_^\\ \nabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
)  # fmt: skip


def test_the_plain_tiny_tokenizer_keeps_its_vocabulary_and_ids():
    for tok in (CharTokenizer(), tiny_tokenizer(make_config("tiny"))):
        assert tok.vocab == PLAIN and tok.unk_token_id is None
        assert tok.encode("<think>7*8</think>\\boxed{56}") == [3, 13, 18, 14, 4, 5, 11, 12, 26]
        with pytest.raises(ValueError, match="'`'"):
            tok.encode("```")


def test_the_tiny_tools_tokenizer_adds_its_markup_after_the_plain_ids():
    tok = tiny_tokenizer(make_config("tiny-tools"))
    assert tok.vocab[: len(PLAIN)] == PLAIN
    assert tok.vocab[len(PLAIN) :] == [*TOOLS_MARKUP, "<unk>"]
    fence, output, close = (len(PLAIN) + i for i in range(3))
    plain = CharTokenizer()
    text = "```python\nprint(12*34)\n```"
    assert tok.encode(text) == [fence, *plain.encode("print(12*34)\n"), close]
    assert tok.encode("\n```output\n408\n\n```\n") == [
        *plain.encode("\n"), output, *plain.encode("408\n\n"), close, *plain.encode("\n")
    ]  # fmt: skip
    assert tok.decode(tok.encode(text)) == text
    # a tool's output may hold any character: those outside the vocabulary read as <unk>, a special token
    assert tok.encode("a\t€") == [*plain.encode("a"), tok.unk_token_id, tok.unk_token_id]
    assert tok.decode(tok.encode("a\t"), skip_special_tokens=False) == "a<unk>" and tok.decode(tok.encode("a\t")) == "a"


@pytest.mark.parametrize(
    "markup, match",
    [(("```", "```"), "'```' is already"), (("+",), "'\\+' is already"), (("",), "must be a non-empty str"),
     (("<unk>",), "'<unk>' is already")],
    ids=["twice", "a-character", "empty", "unk"],
)  # fmt: skip
def test_markup_that_is_already_a_token_is_refused(markup, match):
    with pytest.raises(ValueError, match=match):
        CharTokenizer(markup)


def test_the_products_task():
    problems = load_problems("products:3", seed=0)
    assert len(problems) == 4096 and problems == product_problems(4096, 3, seed=0)
    for p in problems:
        a, b = map(int, p.prompt.removesuffix("=").split("*"))
        assert 100 <= a <= 999 and 100 <= b <= 999 and p.answer == str(a * b)
    with pytest.raises(ValueError, match="products:<digits>"):
        load_problems("products:three", seed=0)
    with pytest.raises(ValueError, match="needs a built-in task"):
        make_config("tiny-tools", dataset="data.jsonl")


def test_tool_demonstrations_call_the_tool_as_a_rollout_does_and_mask_its_output():
    config = make_config("tiny-tools", warmup_sft_noise=0.75)
    tok = tiny_tokenizer(config)
    problem = product_problems(1, 3, seed=5)[0]
    rng = random.Random(0)
    pieces = [tool_demonstration(problem, rng, config.warmup_sft_noise) for _ in range(400)]
    calls = [p for p in pieces if len(p) == 3]
    assert 0.2 < len(calls) / len(pieces) < 0.3  # 1 - noise of them call the tool
    guesses = [p for p in pieces if len(p) == 1]
    reasoning = f"<think>{problem.prompt[:-1]}</think>\\boxed{{"
    for ((text, sampled),) in guesses:  # the product restated, then a number of a product's digits, not the answer
        assert sampled and text.startswith(reasoning) and text.endswith("}")
        assert text[len(reasoning) : -1] != problem.answer and 10_000 <= int(text[len(reasoning) : -1]) < 10**6
    (call, _), (observation, sampled), (answer, _) = calls[0]
    assert call == f"```python\nprint({problem.prompt[:-1]})\n```" and answer == f"\\boxed{{{problem.answer}}}"
    # the observation's ids are the ones the rollout inserts after the call's output, and the warm-up skips them
    turns = tool_turns_of(config, tok)
    assert tok.encode(observation) == turns.observation_ids(ToolResult(problem.answer + "\n", "ok")) and not sampled
    sample = warmup._sample(tok, [1], calls[0])
    n_call, n_obs = len(tok.encode(call)), len(tok.encode(observation))
    assert sample.token_mask == [1.0] * n_call + [0.0] * n_obs + [1.0] * (len(tok.encode(answer)) + 1)
    assert sample.completion_ids[-1] == tok.eos_token_id
    assert warmup._sample(tok, [1], guesses[0]).token_mask is None  # as the plain tiny task's samples


@pytest.mark.parametrize("name", ["products", "products:", "products:x", "products:0", "productsx:3"])
def test_a_bad_products_name_is_refused_at_config_time(name):
    with pytest.raises(ConfigError, match="dataset"):
        make_config("tiny-tools", dataset=name)


def test_the_products_warm_up_needs_the_python_tool():
    config = make_config("tiny-tools", tools="")
    with pytest.raises(ValueError, match="set --tools python"):
        warmup.sft_warmup(None, tiny_tokenizer(config), [], config, packed=True)


@pytest.mark.slow  # two tiny runs of a few seconds each
def test_a_fixed_seed_tiny_step_is_what_the_plain_tokenizer_and_warm_up_give(tmp_path, monkeypatch):
    """The tiny preset's run through the new code paths (the config's tokenizer, warm-up pieces) equals, metric for
    metric, the run with the plain tokenizer and the warm-up samples built as a single sampled text."""

    def run(out):
        config = make_config("tiny", output_dir=str(tmp_path / out), max_steps=2, warmup_sft_steps=30,
                             prompts_per_step=4, group_size=4, save_steps=0, progress=False, plot=False)  # fmt: skip
        train(config)
        rows = read_metrics(config.output_dir)
        return [{k: v for k, v in r.items() if not k.endswith(("_s", "per_s"))} for r in rows]  # timings differ

    built = run("built")
    monkeypatch.setattr(build, "tiny_tokenizer", lambda config: CharTokenizer())

    def plain_sample(tokenizer, prompt_ids, pieces):
        ((text, sampled),) = pieces
        assert sampled
        return Sample(prompt_ids, tokenizer.encode(text) + [tokenizer.eos_token_id], 0.0)

    monkeypatch.setattr(warmup, "_sample", plain_sample)
    assert run("plain") == built


@pytest.mark.slow  # a short fixed-seed run of the preset: about 2 minutes on 2 idle cores
def test_a_short_tiny_tools_run_learns_to_use_the_tool(tmp_path):
    """The warm-up leaves the model calling the tool in a quarter of its completions; GRPO with the python tool
    raises the share of calls and the reward with them (without the tool, `--max-tool-calls 0`, the reward stays
    near 0)."""
    config = make_config("tiny-tools", output_dir=str(tmp_path), max_steps=CI_STEPS, progress=False, plot=False)
    train(config)
    rows = read_metrics(str(tmp_path))
    first, last = rows[:5], rows[-5:]

    def mean(key, rows):
        return sum(r[key] for r in rows) / len(rows)

    assert mean("reward_correct_mean", last) >= mean("reward_correct_mean", first) + 0.2, rows
    assert mean("tool_calls_mean", last) > 0.5
    assert all({"tool_calls_mean", "tool_errors_frac", "tool_timeouts", "tool_time_s"} <= set(r) for r in rows)
