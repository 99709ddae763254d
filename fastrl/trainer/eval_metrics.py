"""Held-out evaluation metrics: unbiased pass@k, mean@k, maj@k, and the per-problem results file.

Pure functions of scored completions (no torch, no model): the loop samples `n` completions for each eval
problem, scores them with the training reward, and hands one `ProblemResult` per problem to `eval_metrics`,
which returns the metrics of that step's row:

    eval_reward_mean            mean reward over all completions
    eval_reward_correct_mean    mean correctness over all completions (mean@n)
    eval_pass@k                 for k = 1, 2, 4, ... <= n: the unbiased estimator 1 - C(n-c, k) / C(n, k) of
                                "at least one of k draws is correct", averaged over problems (c = correct ones)
    eval_maj@k                  for k = 2, 4, ... <= n: the majority answer of the first k completions is correct
                                (only when the verifier gave normalized answers)
    eval_response_length_mean   mean completion length in tokens
    eval_truncation_rate        share of completions cut at the length limit
    eval_time_s                 the evaluation's wall time

With several eval sets each set's names carry its name: `eval_<name>_pass@1`, ... (`eval_set_prefix`).
`write_eval_results` writes the per-problem results to `<output_dir>/eval/step-<N>.jsonl`.

maj@k's vote: completions without an answer (None) do not vote; the answer with the most votes wins, and among
tied answers the one given first (the lowest completion index) wins; with no vote at all the problem counts as
wrong. The winner is correct when the completion that first gave it was judged correct.
"""

import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass

from fastrl.rewards.extract import extract_answer
from fastrl.rewards.normalize import normalize, plain_number

_SET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class ProblemResult:
    """One eval problem and its `n` scored completions (all tuples have length n)."""

    problem_id: str  # a stable id of the problem in its eval set (its index, or the dataset's id)
    prompt: str  # the question as given to the model
    gold: str  # the gold answer the verifier compared against
    completions: tuple[str, ...]  # the completion texts
    rewards: tuple[float, ...]  # the training reward of each completion
    correct: tuple[bool, ...]  # the verifier's verdict (accuracy reward == 1) of each completion
    lengths: tuple[int, ...]  # completion lengths in tokens
    truncated: tuple[bool, ...]  # cut at the length limit
    answers: tuple[str | None, ...] | None = None  # each completion's `vote_key`; None: answers do not compare

    def __post_init__(self):
        n = len(self.completions)
        if n == 0:
            raise ValueError(f"problem {self.problem_id!r} has no completions")
        fields = {"rewards": self.rewards, "correct": self.correct, "lengths": self.lengths,
                  "truncated": self.truncated}  # fmt: skip
        if self.answers is not None:
            fields["answers"] = self.answers
        for name, values in fields.items():
            if len(values) != n:
                raise ValueError(
                    f"problem {self.problem_id!r}: {len(values)} {name} for {n} completions (one each expected)"
                )

    @property
    def n(self) -> int:
        return len(self.completions)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with `c` correct of `n` samples: 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k / i): no binomials, so no overflow or cancellation at large n.
    """
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise TypeError(f"n, c and k must be ints, got n={n!r}, c={c!r}, k={k!r}")
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got k={k}")
    if n - c < k:
        return 1.0  # every k-subset holds a correct sample
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def ks_for(n: int) -> list[int]:
    """The k reported for n samples per problem: 1, 2, 4, ... up to n."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    return ks


def majority_correct(answers: tuple[str | None, ...], correct: tuple[bool, ...]) -> bool:
    """Whether the majority answer of these completions is correct (the tie rule is in the module docstring)."""
    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} answers for {len(correct)} verdicts (one each expected)")
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return False
    most = max(votes.values())
    first = next(i for i, a in enumerate(answers) if a is not None and votes[a] == most)  # a tie: given first wins
    return bool(correct[first])


def vote_key(completion: str) -> str | None:
    """The answer a completion votes for in maj@k: the verifier's extracted answer, normalized, and a plain number
    as its exact value ("0.5", "1/2" and "\\frac{1}{2}" vote together). None: no answer, so no vote."""
    answer = extract_answer(completion)
    if answer is None:
        return None
    text = normalize(answer)
    value = plain_number(text)
    return text if value is None else str(value)


def eval_set_prefix(name: str | None) -> str:
    """`eval_` for the single (unnamed) eval set, `eval_<name>_` for a named one."""
    if name is None:
        return "eval_"
    if not isinstance(name, str) or not _SET_NAME.fullmatch(name):
        raise ValueError(f"eval set name must match {_SET_NAME.pattern} (letters, digits, _ . -), got {name!r}")
    return f"eval_{name}_"


def eval_metrics(results: list[ProblemResult], elapsed_s: float, name: str | None = None) -> dict[str, float]:
    """The eval metrics of one eval set (names in the module docstring), every problem with the same n."""
    if not results:
        raise ValueError("eval_metrics needs at least one problem result")
    ns = sorted({r.n for r in results})
    if len(ns) != 1:
        raise ValueError(f"every problem needs the same number of completions, got n in {ns}")
    if not (isinstance(elapsed_s, (int, float)) and math.isfinite(elapsed_s) and elapsed_s >= 0):
        raise ValueError(f"elapsed_s must be a finite number >= 0, got {elapsed_s!r}")
    prefix, n = eval_set_prefix(name), ns[0]
    count = len(results) * n
    out = {
        "reward_mean": sum(sum(r.rewards) for r in results) / count,
        "reward_correct_mean": sum(sum(r.correct) for r in results) / count,
    }
    for k in ks_for(n):
        out[f"pass@{k}"] = sum(pass_at_k(n, sum(r.correct), k) for r in results) / len(results)
    if all(r.answers is not None for r in results):
        for k in ks_for(n)[1:]:
            out[f"maj@{k}"] = sum(majority_correct(r.answers[:k], r.correct[:k]) for r in results) / len(results)
    out["response_length_mean"] = sum(sum(r.lengths) for r in results) / count
    out["truncation_rate"] = sum(sum(r.truncated) for r in results) / count
    out["time_s"] = float(elapsed_s)
    return {prefix + key: float(value) for key, value in out.items()}


def eval_results_path(output_dir: str, step: int) -> str:
    """`<output_dir>/eval/step-<step>.jsonl`."""
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    return os.path.join(output_dir, "eval", f"step-{step}.jsonl")


def write_eval_results(output_dir: str, step: int, sets: dict[str | None, list[ProblemResult]]) -> str:
    """Write every eval set's per-problem results of `step` to `eval/step-<step>.jsonl`; returns the path.

    One JSON object per problem: `eval_set` (None for the unnamed set), `problem_id`, `prompt`, `gold`,
    `completions`, `rewards`, `correct`, `answers`. The file is written whole and renamed into place, so a
    reader (or a resumed run rewriting the step) never sees half of it.
    """
    path = eval_results_path(output_dir, step)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for name, results in sets.items():
            eval_set_prefix(name)  # checks the name
            for r in results:
                row = {"eval_set": name, "problem_id": r.problem_id, "prompt": r.prompt, "gold": r.gold,
                       "completions": list(r.completions), "rewards": [float(x) for x in r.rewards],
                       "correct": [bool(x) for x in r.correct],
                       "answers": None if r.answers is None else list(r.answers)}  # fmt: skip
                f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)
    return path
