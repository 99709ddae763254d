"""Sympy side of the math verifier: parse leaves, compare expressions, equations, inequalities and structures.

``is_equiv`` has NO time limit of its own: sympy can run for minutes (or forever) on hostile input, so it runs
inside a verifier worker that the parent kills at the deadline (``pool``). LaTeX is parsed with
latex2sympy2_extended (pinned in setup.py; see docs/rewards.md for why), plain text with sympy's ``parse_expr``.
"""

from __future__ import annotations

import functools
import random
import re

import sympy
from latex2sympy2_extended import latex2sympy
from latex2sympy2_extended.math_normalization import NormalizationConfig
from sympy.parsing.sympy_parser import (
    convert_xor,
    implicit_multiplication_application,
    parse_expr,
    standard_transformations,
)

from .normalize import (
    APPROX_MIN_DIGITS,
    INVALID,
    divides_by_zero,
    normalize,
    percent_readings,
    quick_equal,
    split_marker,
    units_conflict,
)
from .structure import Equation, Leaf, Seq, inequality_interval, is_label, parse_structure

__all__ = ["expressions_equal", "is_equiv", "parse_leaf"]

# Relative agreement that counts as equal at one evaluation point (values are computed to 30 digits).
_REL_TOL = sympy.Float("1e-12")
# Relative disagreement that proves two values different; between the two a symbolic check decides.
_REL_DIFFERENT = sympy.Float("1e-6")
_NUM_POINTS = 6
# Above this magnitude, agreement in evalf's ~160 digits is not equality: an exact check decides.
_HUGE = sympy.Float("1e50")
_DIGITS = 30
# Our own normalization runs first, so the parser's only needs to handle basic LaTeX spellings.
_PARSER_NORMALIZATION = NormalizationConfig(
    basic_latex=True, units=False, malformed_operators=False, nits=False, boxed="none", equations=False
)
_PLAIN_FUNCTIONS = re.compile(r"\*\*|\b(?:sqrt|pi|exp|log|ln|sin|cos|tan|factorial|binomial|oo)\b")
_DECIMAL_RE = re.compile(r"(?<![\d.])(\d{1,400})\.(\d{1,400})(?![\d.])")
_SPACED_DIGITS_RE = re.compile(r"(?<![_^\d])\d+\s+\d")  # not "\\log_2 8"
# Operators a restatement leaves unevaluated: "\sum_{k=1}^{100} k" is the question, not the answer 5050.
_UNEVALUATED_RE = re.compile(r"\\(?:sum|prod|int|iint|iiint|oint|lim|limsup|liminf)(?![a-zA-Z])|\\frac\{d\}\{d")
_UNEVALUATED = (sympy.Sum, sympy.Product, sympy.Integral, sympy.Limit)
_TIME_RE = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$")
_RATIO_RE = re.compile(r"^([^:]+):([^:]+)$")
_LONG_DECIMAL_RE = re.compile(r"^[-+]?(\d+)\.(\d+)$")
_TRANSFORMATIONS = standard_transformations + (implicit_multiplication_application, convert_xor)


_PLAIN_NAMES = {"sqrt", "pi", "exp", "log", "ln", "sin", "cos", "tan", "factorial", "binomial", "oo"}


def _safe_for_parse_expr(text: str) -> bool:
    # parse_expr runs eval() on its input and a completion is untrusted text ("sqrt(__import__('os')...)"):
    # only arithmetic characters, numbers, single-letter symbols and a few known function names get through.
    if not re.fullmatch(r"[0-9a-zA-Z+\-*/^()., !]*", text) or re.search(r"[a-zA-Z]\s*\.|\.\s*[a-zA-Z]", text):
        return False
    return all(len(name) == 1 or name in _PLAIN_NAMES for name in re.findall(r"[a-zA-Z]+", text))


@functools.lru_cache(maxsize=4096)  # a gold answer is parsed once per group, not once per completion
def parse_leaf(text: str) -> sympy.Basic | None:
    """Parse one leaf (LaTeX or plain text) into sympy; None when neither parser accepts it."""
    text = text.strip()
    if not text or _SPACED_DIGITS_RE.search(text) or ":" in text:
        return None  # "1 2" is not 12 (nor 1 + 2); "1:00" is a time or a ratio, never 1/0
    try:
        if "\\" not in text and _PLAIN_FUNCTIONS.search(text):
            if not _safe_for_parse_expr(text):
                return None
            expr = parse_expr(text.replace("ln", "log"), transformations=_TRANSFORMATIONS, evaluate=True)
        else:
            # Decimals as exact fractions before parsing: the parser's Floats keep only 15 digits.
            text = _DECIMAL_RE.sub(lambda m: f"\\frac{{{m[1]}{m[2]}}}{{1{'0' * len(m[2])}}}", text)
            expr = latex2sympy(text, normalization_config=_PARSER_NORMALIZATION)
    except Exception:  # both parsers raise many unrelated types on malformed input
        return None
    if isinstance(expr, sympy.MatrixBase) and not isinstance(expr, sympy.Basic):
        expr = sympy.ImmutableMatrix(expr)  # cached, so immutable
    if isinstance(expr, sympy.Basic) and expr.has(sympy.Float):
        # Any decimal left (plain-text input) becomes exact too, so that 0.25 == 1/4 and 0.3333 != 1/3.
        expr = expr.xreplace({f: sympy.Rational(str(f)) for f in expr.atoms(sympy.Float)})
    if isinstance(expr, sympy.MatrixExpr):
        expr = expr.doit()  # a sum or product of explicit matrices is that matrix
    return expr if isinstance(expr, sympy.Basic) else None


def _zeroish(v: sympy.Basic) -> bool:
    # evalf returns "0.e-165" (precision 1) when cancellation leaves no significant digits: that is a zero.
    return v == 0 or (isinstance(v, sympy.Float) and v._prec < 10)


def _close(a: sympy.Basic, b: sympy.Basic) -> bool | None:
    """Compare two evaluated numbers: True (equal), False (different), None (undecided or not numbers)."""
    parts = []
    for v in (a, b):
        re_, im = v.as_real_imag()
        if not (re_.is_Number and im.is_Number) or not (re_.is_finite and im.is_finite):
            return None
        parts.append((sympy.S.Zero if _zeroish(re_) else re_, sympy.S.Zero if _zeroish(im) else im))
    (ar, ai), (br, bi) = parts
    diff = abs(ar - br) + abs(ai - bi)
    scale = max(abs(ar) + abs(ai), abs(br) + abs(bi))
    if scale == 0 or diff <= _REL_TOL * scale:
        return True
    return False if diff > _REL_DIFFERENT * scale else None


def _point_verdict(e1: sympy.Expr, e2: sympy.Expr, point: dict) -> bool | None:
    """Compare two expressions at one point: True, False, or None (undecided, e.g. not a number there)."""
    v1, v2 = e1.evalf(_DIGITS, subs=point), e2.evalf(_DIGITS, subs=point)
    verdict = _close(v1, v2)
    if not verdict:
        return verdict
    # Equal to 12 digits. Inputs are exact (decimals were made rational), so evaluate the difference itself:
    # evalf raises its precision until the difference has accurate digits, or reports "0.e-N" (no accurate
    # digits, magnitude below 10^-N) after about 160 digits of cancellation.
    diff = sympy.Add(e1, -e2, evaluate=False).evalf(_DIGITS, subs=point)
    parts = diff.as_real_imag()
    if not all(p.is_Number for p in parts):
        return None
    if any(p != 0 and not _zeroish(p) for p in parts):
        return False  # 1/2004! against 1/2006!: equal to 12 digits relative to nothing, but accurately apart
    # Agreement to ~160 digits proves nothing for numbers longer than that (3^(10^7) against 3^(10^7) + 1).
    scale = max(abs(v) for v in (*v1.as_real_imag(), *v2.as_real_imag()))
    return True if scale < _HUGE else None


def _sample_points(symbols: list[sympy.Symbol], seed: int) -> list[dict]:
    rng = random.Random(seed)
    # Non-integer values avoid most poles (1/(x-1), n! at negative integers). Some points are negative so that
    # |x| and sqrt(x^2) differ from x; an identity that holds only for x > 0 is then not confirmed either.
    signs = [1, 1, 1, 1, -1, -1][:_NUM_POINTS]
    return [{s: sympy.Float(sign * rng.uniform(0.2, 2.8), _DIGITS) for s in symbols} for sign in signs]


def _ratio_is_constant(d1: sympy.Expr, d2: sympy.Expr, *, positive: bool) -> bool:
    """Whether d1 = c * d2 for a constant c != 0 (c > 0 when ``positive``): the test for equal equations."""
    symbols = sorted(d1.free_symbols | d2.free_symbols, key=str)
    ratios = []
    for point in _sample_points(symbols, seed=1):
        v1, v2 = d1.evalf(_DIGITS, subs=point), d2.evalf(_DIGITS, subs=point)
        if not (v1.is_Number and v2.is_Number) or _zeroish(v1) or _zeroish(v2):
            continue
        ratios.append(v1 / v2)
    if len(ratios) >= 3:
        first = ratios[0]
        if all(_close(r, first) for r in ratios) and (first > 0 or not positive):
            return True
        if any(_close(r, first) is False for r in ratios):
            return False
    ratio = sympy.simplify(d1 / d2)
    return bool(ratio.is_number and ratio != 0 and ratio.is_finite and (ratio.is_positive or not positive))


def expressions_equal(e1: sympy.Basic, e2: sympy.Basic) -> bool:
    """Mathematical equality of two parsed answers: numbers, expressions, relations, sets, matrices."""
    if isinstance(e1, sympy.Eq) and isinstance(e2, sympy.Eq):
        return _ratio_is_constant(e1.lhs - e1.rhs, e2.lhs - e2.rhs, positive=False)
    if isinstance(e1, sympy.core.relational.Relational) or isinstance(e2, sympy.core.relational.Relational):
        return _relations_equal(e1, e2)
    if isinstance(e1, sympy.MatrixBase) and isinstance(e2, sympy.MatrixBase):
        return e1.shape == e2.shape and all(expressions_equal(x, y) for x, y in zip(e1, e2))
    if not (isinstance(e1, sympy.Expr) and isinstance(e2, sympy.Expr)):
        return e1 == e2 or _symbolic_zero(e1, e2)
    if {s.name for s in e1.free_symbols | e2.free_symbols} == {"i"}:  # i alone is the imaginary unit
        e1, e2 = (e.subs({s: sympy.I for s in e.free_symbols}) for e in (e1, e2))
    if e1.has(sympy.zoo, sympy.nan) or e2.has(sympy.zoo, sympy.nan):
        return False  # undefined (1/0, 0/0) is no answer: two undefined values are not equal
    if e1 == e2:
        return True
    if e1.has(*_UNEVALUATED) and sympy.srepr(e1) == sympy.srepr(e2):
        return True  # the same unevaluated sum or integral, whose symbols compare unequal as objects
    if e1.has(sympy.oo, -sympy.oo) or e2.has(sympy.oo, -sympy.oo):
        return False  # infinities equal only structurally (after sympy's own evaluation)
    symbols = sorted(e1.free_symbols | e2.free_symbols, key=str)
    verdicts = []
    for point in _sample_points(symbols, seed=0) if symbols else [{}]:
        verdict = _point_verdict(e1, e2, point)
        if verdict is False:
            return False
        verdicts.append(verdict)
    if verdicts and all(verdicts):
        return True
    return _symbolic_zero(e1, e2)


def _symbolic_zero(e1: sympy.Basic, e2: sympy.Basic) -> bool:
    try:
        if isinstance(e1, sympy.MatrixBase) or isinstance(e2, sympy.MatrixBase):
            return e1.shape == e2.shape and sympy.simplify(e1 - e2).is_zero_matrix is True
        return sympy.simplify(e1 - e2) == 0
    except Exception:  # mismatched kinds (set minus number, ...) are simply not equal
        return False


def _relations_equal(r1: sympy.Basic, r2: sympy.Basic) -> bool:
    """``x > 3`` equals ``3 < x`` and ``2x > 6``: same strictness, differences in a positive ratio."""
    canon = []
    for r in (r1, r2):
        if isinstance(r, (sympy.StrictGreaterThan, sympy.GreaterThan)):
            canon.append((r.lhs - r.rhs, isinstance(r, sympy.StrictGreaterThan)))
        elif isinstance(r, (sympy.StrictLessThan, sympy.LessThan)):
            canon.append((r.rhs - r.lhs, isinstance(r, sympy.StrictLessThan)))
        else:
            return False
    (d1, strict1), (d2, strict2) = canon
    return strict1 == strict2 and _ratio_is_constant(d1, d2, positive=True)


def _leaf_values(text: str, other: str) -> list[sympy.Basic]:
    value_text, marker = split_marker(text)
    value = parse_leaf(value_text)
    if value is None:
        return []
    if marker == "%":
        other_text, other_marker = split_marker(other)
        written, scaled = percent_readings(value_text, marker, other_text, other_marker)
        return [v for v, ok in ((value, written), (value / 100, scaled)) if ok]
    if marker == "°":
        return [value, value * sympy.pi / 180]
    return [value]


def _is_text(s: str) -> bool:
    # A word of 4+ letters that is not a LaTeX command or a known function is prose ("Evelyn", "odd"), which
    # must compare as a string: as a product of symbols, anagrams would be equal.
    words = re.findall(r"(?<![\\a-zA-Z])[a-zA-Z]{4,}", re.sub(r"\\(?:begin|end)\{[a-zA-Z*]*\}", "", s))
    return any(not _PLAIN_FUNCTIONS.fullmatch(w) for w in words)


def _times_or_ratios_equal(a: str, b: str) -> bool:
    """ "7:32" against "7:32" or "14:64" (a ratio); "1:00" against "12:00" (clock times) only when the same."""
    ta, tb = _TIME_RE.match(a.replace(" ", "")), _TIME_RE.match(b.replace(" ", ""))
    if ta or tb:
        return bool(ta and tb) and [int(g or 0) for g in ta.groups()] == [int(g or 0) for g in tb.groups()]
    ra, rb = _RATIO_RE.match(a), _RATIO_RE.match(b)
    if not (ra and rb):
        return False
    parts = [parse_leaf(x) for x in (*ra.groups(), *rb.groups())]
    if any(p is None or not isinstance(p, sympy.Expr) for p in parts) or any(p == 0 for p in parts[1::2]):
        return False
    return expressions_equal(parts[0] * parts[3], parts[1] * parts[2])


def _approximates(decimal_text: str, other: str) -> bool:
    """A decimal of 10+ significant digits ("4.123105625617661") that is ``other``'s value to its last digit."""
    m = _LONG_DECIMAL_RE.match(decimal_text.strip())
    if m is None or len((m.group(1) + m.group(2)).lstrip("0")) < APPROX_MIN_DIGITS:
        return False
    exact = parse_leaf(other)
    if not isinstance(exact, sympy.Expr) or exact.free_symbols:
        return False
    value = exact.evalf(60)
    if not value.is_real:
        return False
    return abs(value - sympy.Rational(decimal_text.strip())) < sympy.Rational(1, 10 ** len(m.group(2)))


def _squash(s: str) -> str:
    # Spaces go, except between two digits: "1 2" is not "12".
    return re.sub(r"(?<!\d)\s+|\s+(?!\d)", "", s).casefold()


def _leaves_equal(a: str, b: str) -> bool:
    if INVALID in (a, b) or divides_by_zero(a) or divides_by_zero(b):
        return False
    if _squash(a) == _squash(b):
        return True
    if _is_text(a) or _is_text(b):
        return False
    if bool(_UNEVALUATED_RE.search(a)) != bool(_UNEVALUATED_RE.search(b)):
        return False  # an unevaluated sum, integral or limit restates the question
    if ":" in a or ":" in b:
        return _times_or_ratios_equal(a, b)
    decided = quick_equal(a, b)
    if decided is not None:
        return decided
    values_a, values_b = _leaf_values(a, b), _leaf_values(b, a)
    if any(expressions_equal(x, y) for x in values_a for y in values_b):
        return True
    return _approximates(a, b) or _approximates(b, a)


def _is_symbol(text: str) -> bool:
    return re.fullmatch(r"[a-zA-Z](?:_\{?\w+\}?)?|\\[a-zA-Z]+", text.strip()) is not None


def _unordered_match(a: tuple, b: tuple) -> bool:
    """Whether the items of ``a`` pair off one-to-one with equal items of ``b`` (a perfect matching).

    Augmenting paths over the n x n equality table: at most n^2 comparisons, where trying permutations would
    explode on repeated items ("1, 1, 1, ..., 2" against "1, 1, 1, ..., 3").
    """
    if len(a) != len(b):
        return False
    equal = [[_structures_equal(x, y) for y in b] for x in a]
    if not all(any(row) for row in equal):
        return False
    owner: list[int | None] = [None] * len(b)  # owner[j]: the item of a matched to b[j]

    def augment(i: int, seen: set[int]) -> bool:
        for j in range(len(b)):
            if equal[i][j] and j not in seen:
                seen.add(j)
                if owner[j] is None or augment(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    return all(augment(i, set()) for i in range(len(a)))


def _answers_rhs(eq: Equation) -> bool:
    """Whether an equation gives its answer on the right: a label ("f(x) = 1") or a computation ("5+6 = 11")."""
    if is_label(eq.lhs):
        return True
    lhs, rhs = parse_leaf(eq.lhs), parse_leaf(eq.rhs)  # "7 = 11a + c" is an equation, not the answer 11a + c
    return all(isinstance(e, sympy.Expr) and not e.free_symbols for e in (lhs, rhs))


_DECIMAL_COMMA_PART = re.compile(r"^\d+$")


def _decimal_comma(seq: Seq) -> Leaf | None:
    """ "1000,99" or "0,111" (a bare two-item list of digits) read as a decimal with a comma: 1000.99, 0.111."""
    if seq.open or len(seq.items) != 2 or not all(isinstance(x, Leaf) for x in seq.items):
        return None
    whole, frac = (x.text for x in seq.items)
    if not (_DECIMAL_COMMA_PART.match(whole) and _DECIMAL_COMMA_PART.match(frac)):
        return None
    if len(frac) == 3 and whole != "0":
        return None  # "1,000" is a thousand, never 1.000
    return Leaf(f"{whole}.{frac}")


def _structures_equal(a, b) -> bool:
    if isinstance(a, Equation) or isinstance(b, Equation):
        if isinstance(a, Equation) and isinstance(b, Equation):
            if is_label(a.lhs) and is_label(b.lhs):
                return _structures_equal(parse_structure(a.rhs), parse_structure(b.rhs))
            e1, e2 = parse_leaf(f"{a.lhs} = {a.rhs}"), parse_leaf(f"{b.lhs} = {b.rhs}")
            if e1 is not None and e2 is not None and expressions_equal(e1, e2):
                return True
            return _answers_rhs(a) and _answers_rhs(b) and _leaves_equal(a.rhs, b.rhs)
        eq, other = (a, b) if isinstance(a, Equation) else (b, a)
        # "x = 3" answers "3"; "x + y = 3" does not.
        return _answers_rhs(eq) and _structures_equal(parse_structure(eq.rhs), other)
    if isinstance(a, Seq) and isinstance(b, Seq):
        if len(a.items) != len(b.items):
            return False
        kinds = {a.open, b.open}
        if kinds <= {"{", "", "u"} and (a.open == b.open or "u" not in kinds):
            return _unordered_match(a.items, b.items)  # sets, bare lists, unions of intervals
        if a.open == "" or b.open == "":
            ordered = kinds == {"", "("} and a.close in ("", ")") and b.close in ("", ")")
        else:
            ordered = (a.open, a.close) == (b.open, b.close)  # tuples and intervals need the same brackets
        return ordered and all(_structures_equal(x, y) for x, y in zip(a.items, b.items))
    if isinstance(a, Leaf) and isinstance(b, Leaf):
        return _leaves_equal(a.text, b.text)
    leaf, seq = (a, b) if isinstance(a, Leaf) else (b, a)
    if isinstance(leaf, Leaf) and isinstance(seq, Seq):
        decimal = _decimal_comma(seq)
        if decimal is not None:
            return _leaves_equal(decimal.text, leaf.text)
        interval = inequality_interval(leaf.text)  # "x > 3" against "(3, \\infty)", "|z| < 1" against "(-1, 1)"
        return interval is not None and _structures_equal(interval, seq)
    return False


def is_equiv(pred: str, gold: str) -> bool:
    """Whether a predicted answer means the same as the gold answer. No time limit: run it in a worker."""
    decided = quick_equal(pred, gold)
    if decided is not None:
        return decided
    if units_conflict(pred, gold):
        return False
    try:
        p, g = normalize(pred), normalize(gold)
        if INVALID in (p, g):
            return False
        return _structures_equal(parse_structure(p), parse_structure(g))
    except Exception:  # sympy raises many types on odd input (TypeError on complex order, ...): not equal
        return False
