"""Eval metrics against hand-computed cases: pass@k against math.comb, maj@k with ties, the row's names and
values, the per-problem results file, and the held-out arithmetic set's disjointness from the training stream."""

import json
import math
from fractions import Fraction

import pytest

from fastrl.trainer import eval_metrics as em
from fastrl.trainer.eval_sets import held_out_arithmetic, trained_arithmetic, training_prompts
from fastrl.trainer.tasks import PromptStream, load_problems


def _comb_pass_at_k(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def test_pass_at_k_matches_the_binomial_form_on_every_small_case():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = _comb_pass_at_k(n, c, k)
                assert em.pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12), (n, c, k)


def test_pass_at_k_hand_cases():
    assert em.pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert em.pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert em.pass_at_k(4, 0, 4) == 0.0
    assert em.pass_at_k(4, 1, 4) == 1.0
    assert em.pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is c / n


def test_pass_at_k_stays_exact_where_the_binomials_overflow_a_float():
    n, c, k = 2000, 3, 1000  # C(2000, 1000) ~ 1e600: a float ratio of binomials is inf / inf
    assert em.pass_at_k(n, c, k) == pytest.approx(float(_comb_pass_at_k(n, c, k)), rel=1e-12)


@pytest.mark.parametrize("n, c, k", [(0, 0, 1), (3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_names_bad_arguments(n, c, k):
    with pytest.raises(ValueError, match=rf"n={n}|k={k}"):
        em.pass_at_k(n, c, k)


def test_ks_are_powers_of_two_up_to_n():
    assert em.ks_for(1) == [1]
    assert em.ks_for(6) == [1, 2, 4]
    assert em.ks_for(8) == [1, 2, 4, 8]
    with pytest.raises(ValueError, match="got 0"):
        em.ks_for(0)


def test_majority_vote_and_its_tie_rule():
    assert em.majority_correct(("4", "3", "4"), (False, True, False)) is False  # "4" has 2 votes
    assert em.majority_correct(("3", "4", "4", "3"), (True, False, False, True)) is True  # 2-2 tie: "3" came first
    assert em.majority_correct(("4", "3", "3", "4"), (False, True, True, False)) is False  # 2-2 tie: "4" came first
    assert em.majority_correct((None, None, "5"), (False, False, True)) is True  # no answer: no vote
    assert em.majority_correct((None, None), (False, False)) is False  # no vote at all: wrong
    with pytest.raises(ValueError, match="2 answers for 3 verdicts"):
        em.majority_correct(("1", "2"), (True, False, True))


def test_vote_keys_are_the_verifiers_normalized_answers():
    assert em.vote_key("<think>3+4</think>\\boxed{7}") == em.vote_key("\\boxed{7.0}") == "7"
    assert em.vote_key("\\boxed{0.5}") == em.vote_key("\\boxed{\\frac{1}{2}}") == em.vote_key("\\boxed{1/2}")
    assert em.vote_key("The final answer is $x^2$") == "x^2"
    assert em.vote_key("no answer here") is None


def _result(pid, correct, answers=None, rewards=None, lengths=None, truncated=None):
    n = len(correct)
    return em.ProblemResult(
        problem_id=pid, prompt=f"q{pid}", gold="7", completions=tuple(f"c{i}" for i in range(n)),
        rewards=tuple(rewards or [float(x) for x in correct]), correct=tuple(correct),
        lengths=tuple(lengths or [10] * n), truncated=tuple(truncated or [False] * n),
        answers=None if answers is None else tuple(answers),
    )  # fmt: skip


def test_the_row_by_hand():
    results = [
        _result("0", [True, False, False, False], ["7", "6", "6", None], [1.0, 0.0, 0.0, -0.5], [4, 8, 8, 20],
                [False, False, False, True]),
        _result("1", [True, True, False, True], ["7", "7", "1", "7"], [1.0, 1.0, 0.0, 1.0], [4, 4, 6, 4]),
    ]  # fmt: skip
    row = em.eval_metrics(results, elapsed_s=2.5)
    expected = {
        "eval_reward_mean": 3.5 / 8,
        "eval_reward_correct_mean": 4 / 8,
        "eval_pass@1": (1 / 4 + 3 / 4) / 2,
        "eval_pass@2": ((1 - 3 / 6) + 1.0) / 2,  # problem 0: 1 - C(3,2)/C(4,2); problem 1: c=3 > n-k
        "eval_pass@4": (1.0 + 1.0) / 2,
        "eval_maj@2": (1 + 1) / 2,  # problem 0: "7" vs "6" tie, "7" first; problem 1: "7" twice
        "eval_maj@4": (0 + 1) / 2,  # problem 0: "6" twice beats "7" once (None does not vote)
        "eval_response_length_mean": (40 + 18) / 8,
        "eval_truncation_rate": 1 / 8,
        "eval_time_s": 2.5,
    }
    assert row.keys() == expected.keys()
    for key, value in expected.items():
        assert row[key] == pytest.approx(value, abs=1e-12), key


def test_named_sets_prefix_every_name_and_no_answers_means_no_maj():
    row = em.eval_metrics([_result("0", [True, False])], elapsed_s=1.0, name="gsm8k")
    assert sorted(row) == sorted(f"eval_gsm8k_{k}" for k in (
        "reward_mean", "reward_correct_mean", "pass@1", "pass@2", "response_length_mean", "truncation_rate",
        "time_s"))  # fmt: skip
    with pytest.raises(ValueError, match="'a b'"):
        em.eval_metrics([_result("0", [True])], elapsed_s=1.0, name="a b")


def test_bad_results_are_named():
    with pytest.raises(ValueError, match=r"n in \[1, 2\]"):
        em.eval_metrics([_result("0", [True]), _result("1", [True, False])], elapsed_s=1.0)
    with pytest.raises(ValueError, match="problem '3': 1 rewards for 2 completions"):
        _result("3", [True, False], rewards=[1.0])
    with pytest.raises(ValueError, match="nan"):
        em.eval_metrics([_result("0", [True])], elapsed_s=float("nan"))
    with pytest.raises(ValueError, match="at least one"):
        em.eval_metrics([], elapsed_s=1.0)


def test_per_problem_results_file(tmp_path):
    sets = {None: [_result("0", [True, False], ["7", "6"])], "hard": [_result("5", [False], [None])]}
    path = em.write_eval_results(str(tmp_path), 20, sets)
    assert path == str(tmp_path / "eval" / "step-20.jsonl")
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    assert rows == [
        {"eval_set": None, "problem_id": "0", "prompt": "q0", "gold": "7", "completions": ["c0", "c1"],
         "rewards": [1.0, 0.0], "correct": [True, False], "answers": ["7", "6"]},
        {"eval_set": "hard", "problem_id": "5", "prompt": "q5", "gold": "7", "completions": ["c0"],
         "rewards": [0.0], "correct": [False], "answers": [None]},
    ]  # fmt: skip
    assert not (tmp_path / "eval" / "step-20.jsonl.tmp").exists()


def test_held_out_arithmetic_is_never_drawn_by_the_training_stream():
    dataset, seed = "arithmetic:9", 0
    held = held_out_arithmetic(dataset, seed, n=64, max_operand=19)
    assert len({p.prompt for p in held}) == 64
    for p in held:
        a, b = map(int, p.prompt[:-1].split("+"))
        assert max(a, b) <= 19 and int(p.answer) == a + b
    stream = PromptStream(load_problems(dataset, seed), seed)
    drawn = {p.prompt for p in stream.next_batch(3 * 4096)}  # three epochs of the training stream
    assert drawn == training_prompts(dataset, seed)
    assert not drawn & {p.prompt for p in held}
    assert held == held_out_arithmetic(dataset, seed, n=64, max_operand=19)  # a fixed set


def test_trained_arithmetic_is_each_drawn_problem_once():
    trained = trained_arithmetic("arithmetic:9", 0)
    assert len(trained) == 100  # every pair (a, b) in 0..9, as 4,096 draws cover them
    assert {p.prompt for p in trained} == training_prompts("arithmetic:9", 0)
    assert all(int(p.answer) == sum(map(int, p.prompt[:-1].split("+"))) for p in trained)


def test_held_out_arithmetic_says_when_the_range_is_all_trained():
    with pytest.raises(ValueError, match="only 0 additions with operands <= 9"):
        held_out_arithmetic("arithmetic:9", 0, n=1, max_operand=9)  # 4,096 draws cover all 100 pairs
    with pytest.raises(ValueError, match="needs? an arithmetic dataset"):
        held_out_arithmetic("data.jsonl", 0, n=1, max_operand=9)
