"""Labelled verifier cases by category: recall (right answers in other spellings) and hostile false positives.

Bare-answer pairs run through ``math_equal`` in both orders (every relation here is symmetric); completion
cases run through ``batch_accuracy_reward`` (rewards default, and the lenient evaluation mode where marked).
"""

import pytest

from fastrl.rewards import VerifierPool, batch_accuracy_reward, extract_answer, gold_answer

pytestmark = pytest.mark.slow  # every test here starts processes (workers, a CLI, a venv)

# (pred, gold, expected), grouped by the spelling they exercise.
PAIRS = {
    "labelled": [
        ("(p,q)=(5,7)", "(5,7)", True),
        ("(p,q)=(5,7)", "(7,5)", False),
        ("g(t)=2t+1", "2t+1", True),
        ("g(t)=2t+1", "2t-1", False),
        ("y = 9", "9", True),
        ("|PQ| = 4", "4", True),
        ("m\\angle ABC = 40", "40", True),
        ("a=3,b=4", "3,4", True),
        ("2x = 6", "6", False),  # an expression on the left is not a label
        ("x + y = 6", "6", False),
        ("7 = 2a+b", "2a+b", False),  # an equation, not the answer 2a+b
        ("12 = 5 + 7 = 12", "12", True),
    ],
    "chains-and-semicolons": [
        ("x = 2+3 = 5", "x = 5", True),
        ("x = 2+3 = 6", "x = 5", False),
        ("p=2,q=3;p=3,q=2", "(2,3),(3,2)", True),
        ("p=2,q=3;p=3,q=5", "(2,3),(3,2)", False),
        ("(1;2;3)", "(1,2,3)", True),
        ("(1;2;3)", "(1,3,2)", False),
    ],
    "matrices": [
        ("\\begin{bmatrix}1 & 2 \\\\ 3 & 4\\end{bmatrix}", "\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix}", True),
        (
            "\\left[\\begin{array}{cc}2 & 0 \\\\ 0 & 2\\end{array}\\right]",
            "\\begin{pmatrix}2&0\\\\0&2\\end{pmatrix}",
            True,
        ),
        ("\\begin{bmatrix}1 & 2 \\\\ 3 & 4\\end{bmatrix}", "\\begin{pmatrix}1 & 2 \\\\ 4 & 3\\end{pmatrix}", False),
        (
            "\\begin{pmatrix}1\\\\2\\end{pmatrix}+\\begin{pmatrix}3\\\\4\\end{pmatrix}",
            "\\begin{pmatrix}4\\\\6\\end{pmatrix}",
            True,
        ),
        ("\\begin{pmatrix}1 & 2\\end{pmatrix}", "\\begin{pmatrix}1 \\\\ 2\\end{pmatrix}", False),
    ],
    "mixed-numbers": [
        ("3 1/4", "13/4", True),
        ("-3 1/4", "-13/4", True),
        ("3 1/4", "3", False),
        ("3 1/4", "12", False),
        ("5\\frac{2}{3}", "\\frac{17}{3}", True),
        ("2 0/5", "2", True),
        ("2 5/5", "3", False),  # not a mixed number: its fraction is not proper
        ("2 7/5", "17/5", False),
        ("2 1/0", "2", False),
        ("2 000 1/2", "4001/2", True),
        ("3 1/4%", "13/400", True),
        ("3 1/4%", "13/4", False),
    ],
    "number-spacing": [
        ("1 2", "12", False),  # the fast path must not delete spaces
        ("1 2", "3", False),
        ("4 4/9", "44/9", False),
        ("12 345", "12345", True),  # a spaced thousands group
        ("33,\\! 333", "33333", True),
        ("7{,}500", "7500", True),
        ("0,25", "0.25", True),  # a decimal comma
        ("1,000", "1", False),  # but "1,000" is a thousand
    ],
    "notation": [
        ("x \\neq 2", "x != 2", True),
        ("x \\ne 2", "x \\neq 2", True),
        ("x \\neq 2", "x \\neq 3", False),
        ("8\\textnormal{ km}", "8 km", True),
        ("8\\textnormal{ km}", "8", True),
        ("15 percentage", "15\\%", True),
        ("15 pct", "0.15", True),
        ("1; 2; 3", "3, 2, 1", True),
        ("{2,5}", "(2,5)", True),
        ("{2,5}", "(5,2)", False),
        ("x=1ory=2", "x=1, y=2", True),
        ("|w| < 2", "(-2, 2)", True),
        ("|w| < 2", "[-2, 2]", False),
        ("1 \\leq |w| \\leq 2", "[-2,-1] \\cup [1,2]", True),
        ("|w| > 3", "(-\\infty,-3) \\cup (3,\\infty)", True),
        ("0 < g(t) < 4", "(0, 4)", True),
        ("0 < g(t) < 4", "(0, 5)", False),
        ("3.605551275463989", "\\sqrt{13}", True),  # 16 digits of an exact value
        ("3.605551275463", "\\sqrt{13}", True),
        ("3.6055", "\\sqrt{13}", False),  # a rounded decimal is not the value
        ("3.605551275464999", "\\sqrt{13}", False),
    ],
    "undefined": [
        ("1/0", "7/0", False),
        ("\\frac{2}{0}", "\\frac{5}{0}", False),
        ("0/0", "0/0", False),
        ("1:00", "12:00", False),
        ("3:45", "3:45", True),
        ("2:3", "4:6", True),  # a ratio
        ("2:3", "3:2", False),
    ],
    "restatements": [
        ("\\sum_{k=1}^{100} k", "5050", False),
        ("\\int_0^1 x\\,dx", "\\frac{1}{2}", False),
        ("\\lim_{x\\to 0} \\frac{\\sin x}{x}", "1", False),
        ("\\prod_{k=1}^{5} k", "120", False),
        ("\\frac{d}{dx} x^2", "2x", False),
    ],
    "units": [
        ("5 m", "5 cm", False),
        ("5 \\text{ m}", "5 \\text{ cm}", False),
        ("3 \\text{ kg}", "3 g", False),
        ("2 \\text{ hours}", "2 h", True),
        ("6 \\text{ ft}^2", "6 square feet", True),
        ("6 \\text{ ft}^2", "6 ft", False),
    ],
}
CASES = [(*p, f"{group}: {p[0]} | {p[1]}") for group, pairs in PAIRS.items() for p in pairs]

# (completion, gold, expected reward, expected in lenient mode)
COMPLETIONS = [
    # several boxes, and hedging
    ("So $\\boxed{2}$ and $\\boxed{3}$.", "2, 3", 1.0, 1.0),
    ("\\boxed{(1,2)}, \\boxed{(2,1)}", "(2,1),(1,2)", 1.0, 1.0),
    ("First \\boxed{7}. Hmm, wait, that cannot be right because the sum is odd. \\boxed{8}", "8", 0.0, 0.0),
    ("\\boxed{6} so the answer is \\boxed{6}", "6", 1.0, 1.0),
    ("The answer is \\boxed{13}", "\\boxed{1}, \\boxed{2}, \\boxed{13}", 0.0, 0.0),
    ("The answer is \\boxed{13}", "First $\\boxed{12}$. Then, by a long argument, $\\boxed{13}$.", 0.0, 0.0),
    # answer markers with the sentence around them
    ("Final Answer: The final answer is 34. I hope it is correct.", "34", 1.0, 1.0),
    ("Final Answer: The final answer is 35. I hope it is correct.", "34", 0.0, 0.0),
    ("Final Answer: The smallest $k$ is 21.", "21", 1.0, 1.0),
    ("Answer $\\frac{3}{4}$", "0.75", 1.0, 1.0),
    ("... \\boxed{200} so far. Final Answer: The final answer is $1,250$.", "1250", 1.0, 1.0),
    # free text: only in the lenient evaluation mode
    ("Thus the probability is 3/8.", "3/8", 0.0, 1.0),
    ("So we get $x = 4$.", "4", 0.0, 1.0),
    ("The total is 1,234.5 dollars", "1234.5", 0.0, 1.0),
    ("The total is 17, not 71.", "71", 0.0, 1.0),  # why lenient is off for rewards: it takes the last number
    ("Answer $ \n 9 \n $", "9", 0.0, 0.0),  # an inline span that crosses lines is no answer
]


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(2) as p:
        p.start()
        yield p


@pytest.mark.parametrize("pred,gold,expected,label", CASES, ids=[c[3] for c in CASES])
def test_labelled_pair_both_orders(pool, pred, gold, expected, label):
    assert pool.math_equal(pred, gold, timeout=10.0) is expected
    assert pool.math_equal(gold, pred, timeout=10.0) is expected


def test_every_category_has_traps():
    for group, pairs in PAIRS.items():
        assert any(not e for *_, e in pairs), group


@pytest.mark.parametrize("completion,gold,reward,lenient", COMPLETIONS, ids=[c[0][:40] for c in COMPLETIONS])
def test_completion(pool, completion, gold, reward, lenient):
    assert batch_accuracy_reward([completion], [gold], pool=pool, timeout=10.0) == [reward]
    assert batch_accuracy_reward([completion], [gold], pool=pool, timeout=10.0, lenient=True) == [lenient]


def test_extraction_details():
    assert extract_answer("\\boxed{1} papers and \\boxed{2} bins") == "1, 2"
    assert extract_answer("\\\\boxed{\\\\frac{1}{2}}") == "\\frac{1}{2}"  # escaped twice
    assert extract_answer("no box, no marker: 42") is None
    assert extract_answer("no box, no marker: 42", lenient=True) == "42"
    assert extract_answer("see $x^2$ and then 42 apples", lenient=True) == "42"
    assert gold_answer("Thus the answer is $\\boxed{7}$.") == "7"
    assert gold_answer("Final Answer: The final answer is $28\\%$. I hope it is correct.") == "28\\%"
    assert gold_answer("\\boxed{5") == "5"  # a gold's last box may run to the end
    assert gold_answer(12) == "12"
