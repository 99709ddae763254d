"""Answer extraction, accuracy/format rewards, Kimi length penalty, DAPO overlong penalty, reward combination."""

import math

import pytest

from fastrl.rewards import (
    WeightedReward,
    accuracy_reward,
    batch_accuracy_reward,
    combine_rewards,
    extract_answer,
    format_reward,
    length_penalty,
    overlong_penalty,
)

EXTRACTION = [
    ("The answer is \\boxed{42}.", "42"),
    ("\\boxed{1} first, then \\boxed{2}", "1, 2"),  # every box is part of the answer
    ("\\boxed{3}. Let me check that again, it seems off by two. \\boxed{5}", None),  # hedging: no single answer
    ("\\boxed{4} so \\boxed{4}", "4"),
    ("nested \\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),
    ("set \\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
    ("\\fbox{7}", "7"),
    ("$\\boxed 5$", "5"),
    ("\\boxed{\\boxed{3}}", "3"),
    ("<think>maybe \\boxed{1}</think> so \\boxed{2}", "2"),
    ("<think>maybe \\boxed{1}</think> no box here", None),
    ("<think>still thinking \\boxed{1}", None),
    ("</think>only a closing tag: \\boxed{9}", "9"),
    ("truncated \\boxed{\\frac{1}{2}", None),
    ("\\boxed{1} and then a truncated \\boxed{2", None),
    ("empty \\boxed{}", None),
    ("So the final answer is $\\frac{3}{4}$.", "\\frac{3}{4}"),
    ("Answer: 12", "12"),
    ("**Answer:** 12 apples", "12 apples"),
    ("the answer is 5. The answer is 6.", "6"),
    ("no answer in this text", None),
    ("", None),
]


@pytest.mark.parametrize("text,expected", EXTRACTION, ids=[f"{i}" for i in range(len(EXTRACTION))])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_answer_rejects_non_str():
    with pytest.raises(TypeError, match="int"):
        extract_answer(3)


@pytest.mark.slow
def test_accuracy_reward():
    assert accuracy_reward("<think>2+2</think> \\boxed{4}", "4") == 1.0
    assert accuracy_reward("<think>2+2</think> \\boxed{4\\sqrt{2}}", "4") == 0.0
    assert accuracy_reward("no answer", "4") == 0.0
    assert accuracy_reward("\\boxed{\\frac12}", "Solution ... so $\\boxed{0.5}$") == 1.0  # boxed gold
    assert accuracy_reward("\\boxed{1,200}", "Janet sells 12 * 100 = 1200 eggs.\n#### 1200") == 1.0  # GSM8K gold
    assert accuracy_reward("\\boxed{12}", "Janet sells 12 * 100 = 1200 eggs.\n#### 1200") == 0.0
    assert accuracy_reward("\\boxed{7}", 7) == 1.0  # numeric gold


@pytest.mark.slow
def test_batch_accuracy_reward():
    completions = ["\\boxed{4}", "\\boxed{5}", "The answer is 1/2", "\\boxed{(1,2)}", "\\boxed{x"]
    golds = ["4", "4", "0.5", "(2,1)", "x"]
    assert batch_accuracy_reward(completions, golds) == [1.0, 0.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="2 completions but 1 gold"):
        batch_accuracy_reward(["a", "b"], ["a"])


@pytest.mark.parametrize(
    "completion,expected",
    [
        ("<think>work</think> \\boxed{1}", 1.0),
        ("  <think>\nwork\n</think>\nThe answer is 3.", 1.0),
        ("<think>work</think> no answer", 0.0),
        ("<think></think> \\boxed{1}", 0.0),
        ("\\boxed{1}", 0.0),
        ("<think>work \\boxed{1}", 0.0),
        ("<think>a</think><think>b</think> \\boxed{1}", 0.0),
        ("<think>a <think> b</think> \\boxed{1}", 0.0),
        ("<think>work</think> \\boxed{1", 0.0),
        ("text first <think>work</think> \\boxed{1}", 0.0),
    ],
)
def test_format_reward(completion, expected):
    assert format_reward(completion) == expected


def test_format_reward_with_think_opened_by_the_prompt():
    assert format_reward("reasoning</think> \\boxed{1}", think_in_prompt=True) == 1.0
    assert format_reward("reasoning</think> \\boxed{1}") == 0.0
    assert format_reward("<think>reasoning</think> \\boxed{1}", think_in_prompt=True) == 0.0
    assert format_reward("reasoning \\boxed{1}", think_in_prompt=True) == 0.0
    assert format_reward("  </think> \\boxed{1}", think_in_prompt=True) == 0.0


def test_length_penalty_kimi():
    lengths = [100, 150, 200, 300]
    correct = [True, False, True, False]
    # lambda = 0.5 - (len - 100) / 200 = [0.5, 0.25, 0.0, -0.5]; wrong ones get min(0, lambda).
    assert length_penalty(lengths, correct) == pytest.approx([0.5, 0.0, 0.0, -0.5])
    assert length_penalty([7, 7, 7], [True, False, True]) == [0.0, 0.0, 0.0]
    assert length_penalty([], []) == []
    assert length_penalty([10, 30], [False, True]) == pytest.approx([0.0, -0.5])


def test_length_penalty_rejects_bad_input():
    with pytest.raises(ValueError, match="2 lengths but 1"):
        length_penalty([1, 2], [True])
    with pytest.raises(ValueError, match="-3"):
        length_penalty([1, -3], [True, True])
    with pytest.raises(ValueError, match="nan"):
        length_penalty([1, float("nan")], [True, True])


@pytest.mark.parametrize(
    "length,expected",
    [(0, 0.0), (80, 0.0), (85, -0.25), (90, -0.5), (99, -0.95), (100, -1.0), (101, -1.0), (10_000, -1.0)],
)
def test_overlong_penalty_dapo(length, expected):
    assert overlong_penalty(length, max_length=100, buffer=20) == pytest.approx(expected)


def test_overlong_penalty_edges():
    assert overlong_penalty(100, 100, 0) == 0.0  # zero buffer: a hard cutoff, no division by zero
    assert overlong_penalty(101, 100, 0) == -1.0
    assert overlong_penalty(5, 100, 100) == pytest.approx(-0.05)
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(5, 100, 101)
    with pytest.raises(ValueError, match="max_length"):
        overlong_penalty(5, 0, 0)
    with pytest.raises(ValueError, match="-1"):
        overlong_penalty(-1, 100, 10)


def test_combine_rewards_totals_and_per_function_values():
    combined = combine_rewards([(accuracy_reward, 1.0), (format_reward, 0.2)])
    completions = ["<think>ok</think> \\boxed{2}", "\\boxed{2}", "<think>ok</think> \\boxed{3}"]
    scores = combined.score(completions, ["2", "2", "2"])
    assert scores.per_fn == {"accuracy_reward": [1.0, 1.0, 0.0], "format_reward": [1.0, 0.0, 1.0]}
    assert scores.total == pytest.approx([1.2, 1.0, 0.2])
    assert combined(completions[0], "2") == pytest.approx(1.2)


def test_combine_rewards_custom_function_and_batch_form():
    calls = []

    def brevity(completion: str, gold: str) -> float:
        return -len(completion) / 100

    def batch_brevity(completions, golds):
        calls.append(len(completions))
        return [brevity(c, g) for c, g in zip(completions, golds)]

    combined = combine_rewards(
        [
            ("correct", accuracy_reward, 1.0),
            WeightedReward(fn=brevity, weight=0.5, name="short", batch_fn=batch_brevity),
        ]
    )
    scores = combined.score(["\\boxed{1}", "\\boxed{10}"], ["1", "1"])
    assert calls == [2]  # the batch form ran once for the whole batch
    assert scores.per_fn["correct"] == [1.0, 0.0]
    assert scores.total == pytest.approx([1.0 - 0.5 * 0.09, -0.5 * 0.10])


def test_combine_rewards_rejects_bad_terms():
    with pytest.raises(ValueError, match="at least one"):
        combine_rewards([])
    with pytest.raises(ValueError, match="unique"):
        combine_rewards([(format_reward, 1.0), (format_reward, 2.0)])
    with pytest.raises(ValueError, match="inf"):
        combine_rewards([(format_reward, math.inf)])
    with pytest.raises(TypeError, match="callable"):
        combine_rewards([("x", 3, 1.0)])
    with pytest.raises(TypeError, match="must be"):
        combine_rewards([format_reward])
    nan_reward = combine_rewards([("nan", lambda c, g: float("nan"), 1.0)])
    with pytest.raises(ValueError, match="non-finite"):
        nan_reward.score(["a"], ["b"])
