"""String side of the math verifier: answer extraction, normalization, structure, a numeric fast path.

Everything here is plain Python (``re`` and ``fractions``), runs in bounded time on bounded input and never
imports sympy or torch, so the trainer process can use it directly and the verifier workers (see
``verifier_pool``) load it without the package's heavy imports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

# Inputs longer than this skip the in-process fast path and go to a worker, where a time limit applies.
MAX_FAST_PATH_CHARS = 200
# A decimal exponent beyond this makes Fraction arithmetic itself slow; such numbers go to a worker.
_MAX_EXPONENT = 400

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\b")
_MARKER_RE = re.compile(r"(?:final\s+answer|answer)\s*(?:is|:)\s*[:*]*\s*", re.IGNORECASE)
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """The content of the brace group opening at ``text[start]`` and the index after it; None if unclosed."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            continue
        if c == "{" and (i == 0 or text[i - 1] != "\\"):
            depth += 1
        elif c == "}" and (i == 0 or text[i - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def _last_boxed(text: str) -> str | None:
    matches = list(_BOX_RE.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end() :]
    stripped = rest.lstrip()
    if stripped.startswith("{"):
        group = _braced(stripped, 0)
        if group is None:
            return None  # an unclosed box is a truncated answer, not an earlier one
        content = group[0].strip()
    else:
        # "\boxed 5": the argument is the next token.
        m = re.match(r"\s+([^\s$]+)", rest)
        content = m.group(1) if m else ""
    return content


def _marked_answer(text: str) -> str | None:
    matches = list(_MARKER_RE.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end() :].split("\n", 1)[0].strip()
    math = re.match(r"\$\$?(.+?)\$\$?", rest) or re.search(r"\\\((.+?)\\\)", rest)
    if math:
        rest = math.group(1)
    return rest.strip().strip("*").rstrip(".").strip() or None


def extract_answer(text: str) -> str | None:
    """The final answer of a completion: the last ``\\boxed{...}`` / ``\\fbox{...}``, else an "answer is" marker.

    When the completion has a ``</think>`` the search covers only the text after the last one; an open
    ``<think>`` that never closes means the model never answered. Returns None when there is no complete answer
    (no marker, an empty box, or an unclosed brace).
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_answer expects a str, got {type(text).__name__}: {text!r:.80}")
    if _THINK_CLOSE in text:
        text = text.rsplit(_THINK_CLOSE, 1)[1]
    elif _THINK_OPEN in text:
        return None
    if _BOX_RE.search(text):
        answer = _last_boxed(text)
        # "\boxed{\boxed{3}}": unwrap, a loop rather than recursion so that deep nesting cannot overflow.
        while answer and _BOX_RE.search(answer):
            inner = _last_boxed(answer)
            if inner is None or inner == answer:
                break
            answer = inner
    else:
        answer = _marked_answer(text)
    return answer or None


_UNICODE_MATH = str.maketrans(
    {"−": "-", "×": "\\times ", "·": "\\cdot ", "÷": "/", "π": "\\pi ", "∞": "\\infty ", "√": "\\sqrt "}
)
_TEXT_RE = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname\*?)\s*\{([^{}]*)\}")
_UNITS = (
    "cm|mm|km|m|meters?|centimeters?|millimeters?|kilometers?|in|inch|inches|ft|feet|foot|yd|yards?|mi|miles?|"
    "kg|g|grams?|kilograms?|lbs?|pounds?|oz|ounces?|s|sec|seconds?|min|minutes?|h|hr|hrs|hours?|days?|weeks?|"
    "months?|years?|units?|square|sq|cubic|dollars?|cents?|mph|liters?|l|ml|gallons?|degrees?|people|students|"
    "points?|ways|times"
)
# Word boundaries keep the repetition unambiguous ("mmm" is not "m" "m" "m"), so matching stays linear.
_TRAILING_UNIT_RE = re.compile(rf"(?<=[\d}}])\s+(?:\b(?:{_UNITS})\b(?:\^\{{?[23]\}}?)?\s*)+$", re.IGNORECASE)
_THOUSANDS_RE = re.compile(r"^([-+]?)(\d{1,3}(?:,\d{3})+)(\.\d+)?$")


def normalize(answer: str) -> str:
    """Canonical text of one answer: math delimiters, spacing, text/units, currency, degrees, percent.

    Percent becomes a trailing ``%`` and degrees a trailing ``°``, for the comparison to read either way.
    """
    s = answer.strip().translate(_UNICODE_MATH)
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            s = s[len(left) : len(s) - len(right)].strip()
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\(?:displaystyle|left|right|bigl?|bigr?|Bigl?|Bigr?)(?![a-zA-Z])", "", s)
    s = re.sub(r"\\[,!]|\{,\}", "", s)
    s = re.sub(r"\\[;:>]|\\q?quad|~|\\ ", " ", s)
    s = re.sub(r"\\[dtc]frac", r"\\frac", s)
    s = re.sub(r"\\frac\s*([0-9a-zA-Z])", r"\\frac{\1}", s)
    s = re.sub(r"\\frac(\{[^{}]*\})\s*([0-9a-zA-Z])", r"\\frac\1{\2}", s)
    s = re.sub(r"\\sqrt\s*([0-9a-zA-Z])", r"\\sqrt{\1}", s)
    s = s.replace("\\le ", "\\leq ").replace("\\ge ", "\\geq ")
    s = re.sub(r"\\text\{\s*(?:and|or)\s*\}|\s+(?:and|or)\s+", ",", s)
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree|°|\s*degrees?$", "°", s)
    s = re.sub(r"\\%|%|\s*percent$", "%", s)
    s = re.sub(r"\s*(?:dollars?|USD|€|£)$", "", s)
    # \text{...}: units after a value are dropped; an answer that is only text keeps its words.
    without_text = re.sub(_TEXT_RE.pattern + r"(?:\^\{?[23]\}?)?", "", s).strip()
    s = without_text if without_text and without_text not in "-+" else _TEXT_RE.sub(r"\1", s)
    s = _TRAILING_UNIT_RE.sub("", s)
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
    s = re.sub(r"\b(?:infinity|inf)\b", r"\\infty", s)
    if re.fullmatch(r"\\\{\s*\\\}|\\varnothing|\\O|\{\s*\}", s):
        s = "\\emptyset"
    m = _THOUSANDS_RE.match(s)  # "1,234" is a number; "1, 234" (with a space) stays a list of two
    if m:
        s = m.group(1) + m.group(2).replace(",", "") + (m.group(3) or "")
    return s


# The structure of an answer: a leaf expression, an equation, or a sequence of items with its brackets.
@dataclass(frozen=True)
class Leaf:
    text: str


@dataclass(frozen=True)
class Equation:
    lhs: str
    rhs: str


@dataclass(frozen=True)
class Seq:
    items: tuple  # of Leaf | Equation | Seq
    open: str  # "(" "[" "{" for sets, "" for a bare comma list; "u" for a union of intervals
    close: str


_OPENERS = {"(": "(", "[": "[", "\\{": "{", "\\langle": "("}
_CLOSERS = {")": ")", "]": "]", "\\}": "}", "\\rangle": ")"}


_COMMAND_RE = re.compile(r"\\(?:[a-zA-Z]+|.)?")


def _tokens_at(s: str, i: int, table: dict[str, str]) -> tuple[str, int] | None:
    for tok, kind in table.items():
        if s.startswith(tok, i):
            return kind, len(tok)
    return None


def _split_top(s: str, sep: str) -> list[str]:
    """Split on ``sep`` outside any bracket or brace."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        if s.startswith(sep, i) and depth == 0:
            parts.append(s[start:i])
            i += len(sep)
            start = i
            continue
        if _tokens_at(s, i, _OPENERS) or s[i] == "{":
            depth += 1
        elif _tokens_at(s, i, _CLOSERS) or s[i] == "}":
            depth -= 1
        i += len(_COMMAND_RE.match(s, i).group()) if s[i] == "\\" else 1
    parts.append(s[start:])
    return parts


def _enclosing(s: str) -> tuple[str, str, str] | None:
    """(open kind, inner text, close kind) when one bracket pair spans the whole string."""
    op = _tokens_at(s, 0, _OPENERS)
    if op is None:
        return None
    for tok, kind in _CLOSERS.items():
        if s.endswith(tok):
            inner = s[op[1] : len(s) - len(tok)]
            depth = 0
            for part in re.finditer(r"\\langle|\\rangle|\\\{|\\\}|[()\[\]{}]", inner):
                depth += 1 if part.group() in ("(", "[", "{", "\\{", "\\langle") else -1
                if depth < 0:
                    return None  # the first bracket closes before the end: "(x+1)(x-1)"
            return op[0], inner, kind
    return None


def parse_structure(s: str) -> Leaf | Equation | Seq:
    """The structure of a normalized answer (sets, tuples, intervals, unions, lists, equations, leaves)."""
    s = re.sub(r"^[a-zA-Z]\s*\\in\s*", "", s.strip())
    union = _split_top(s, "\\cup")
    if len(union) > 1:
        return Seq(tuple(parse_structure(p) for p in union), "u", "u")
    enclosed = _enclosing(s)
    if enclosed is not None:
        open_, inner, close = enclosed
        items = _split_top(inner, ",")
        if len(items) > 1:
            return Seq(tuple(parse_structure(p) for p in items), open_, close)
        if (open_, close) in (("(", ")"), ("{", "}")):
            return parse_structure(inner)
    items = _split_top(s, ",")
    if len(items) > 1:
        return Seq(tuple(parse_structure(p) for p in items), "", "")
    pm = re.split(r"\\pm|\\mp", s)
    if len(pm) == 2:
        # "1 \pm \sqrt{2}" is the two answers 1 + sqrt(2) and 1 - sqrt(2).
        return Seq((parse_structure(f"{pm[0]}+{pm[1]}"), parse_structure(f"{pm[0]}-{pm[1]}")), "", "")
    sides = _split_top(s, "=")
    if len(sides) == 2 and not re.search(r"[<>!\\]$", sides[0]):
        return Equation(sides[0].strip(), sides[1].strip())
    return Leaf(s.strip())


# relation -> (direction, closed)
_RELATIONS = {"<": ("<", False), "\\lt": ("<", False), ">": (">", False), "\\gt": (">", False)}
_RELATIONS |= {op: ("<", True) for op in ("<=", "\\le", "\\leq", "\\leqslant", "≤")}
_RELATIONS |= {op: (">", True) for op in (">=", "\\ge", "\\geq", "\\geqslant", "≥")}
_RELATION_RE = re.compile(
    "(" + "|".join(re.escape(op) for op in sorted(_RELATIONS, key=len, reverse=True)) + ")(?![a-zA-Z])"
)
_VARIABLE_RE = re.compile(r"[a-zA-Z]")


def inequality_interval(s: str) -> Seq | None:
    """The interval a one-variable inequality describes ("x > 3" -> (3, inf), "1 <= x < 2" -> [1, 2)), or None."""
    tokens = [t.strip() for t in _RELATION_RE.split(s)]
    ops = [_RELATIONS[op] for op in tokens[1::2]]
    values = tokens[0::2]
    if len(values) == 2:
        if _VARIABLE_RE.fullmatch(values[1]) and not _VARIABLE_RE.fullmatch(values[0]):
            values.reverse()  # "3 < x" is "x > 3"
            ops = [(">" if ops[0][0] == "<" else "<", ops[0][1])]
        if not _VARIABLE_RE.fullmatch(values[0]):
            return None
        (direction, closed), bound = ops[0], values[1]
        if direction == ">":
            return Seq((Leaf(bound), Leaf("\\infty")), "[" if closed else "(", ")")
        return Seq((Leaf("-\\infty"), Leaf(bound)), "(", "]" if closed else ")")
    if len(values) == 3 and _VARIABLE_RE.fullmatch(values[1]) and ops[0][0] == ops[1][0]:
        (direction, closed_lo), (_, closed_hi) = ops
        lo, hi = values[0], values[2]
        if direction == ">":
            lo, hi, closed_lo, closed_hi = hi, lo, closed_hi, closed_lo
        return Seq((Leaf(lo), Leaf(hi)), "[" if closed_lo else "(", "]" if closed_hi else ")")
    return None


_NUMBER_RE = re.compile(r"^([-+]?)(\d+(?:\.\d*)?|\.\d+)(?:(?:e|E|\\times\s*10\^|\\cdot\s*10\^)\{?([-+]?\d+)\}?)?$")
_FRAC_RE = re.compile(r"^([-+]?)\\frac\{([-+]?\d+)\}\{(\d+)\}$|^([-+]?\d+)\s*/\s*(\d+)$")


def plain_number(s: str) -> Fraction | None:
    """The exact value of a plain numeral (integer, decimal, scientific, integer fraction), else None."""
    s = s.replace(" ", "")
    m = _NUMBER_RE.match(s)
    if m:
        sign, digits, exponent = m.groups()
        if len(digits) > _MAX_EXPONENT or (exponent and abs(int(exponent)) > _MAX_EXPONENT):
            return None
        value = Fraction(digits) * Fraction(10) ** int(exponent or 0)
        return -value if sign == "-" else value
    m = _FRAC_RE.match(s)
    if m and max(len(g or "") for g in m.groups()) <= _MAX_EXPONENT:
        sign, num, den = (m.group(1), m.group(2), m.group(3)) if m.group(2) else ("", m.group(4), m.group(5))
        if int(den) == 0:
            return None
        value = Fraction(int(num), int(den))
        return -value if sign == "-" else value
    return None


def split_marker(s: str) -> tuple[str, str]:
    """(value text, marker): the marker is "%" (read as v or v/100), "°" (v or v*pi/180) or ""."""
    if s.endswith("%") or s.endswith("°"):
        return s[:-1].strip(), s[-1]
    return s, ""


def quick_equal(pred: str, gold: str) -> bool | None:
    """Decide cheaply when both answers are plain numbers (exact rational comparison); None when undecided."""
    if len(pred) > MAX_FAST_PATH_CHARS or len(gold) > MAX_FAST_PATH_CHARS:
        return None
    p, g = normalize(pred), normalize(gold)
    if p == g and p:
        return True
    candidates: list[tuple[Fraction, str]] = []
    for text in (p, g):
        value_text, marker = split_marker(text)
        value = plain_number(value_text)
        if value is None:
            return None
        # A rational number of degrees is a rational number of radians only at 0, so v*pi/180 adds nothing.
        candidates.append((value, marker))
    (a, a_marker), (b, b_marker) = candidates
    if a_marker != b_marker and "%" in (a_marker, b_marker):
        # "50%" against "0.5" or "50": either reading counts, but only when one side alone has the sign.
        return a == b or (a / 100 == b if a_marker == "%" else a == b / 100)
    return a == b
