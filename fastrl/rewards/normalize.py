"""String side of the math verifier: normalization and a numeric fast path (exact rationals).

Everything here is plain Python (``re`` and ``fractions``), runs in bounded time on bounded input and never
imports sympy, so the calling process uses it directly to decide plain numbers without a worker.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["MAX_FAST_PATH_CHARS", "normalize", "plain_number", "quick_equal", "split_marker"]

# Inputs longer than this skip the in-process fast path and go to a worker, where a time limit applies.
MAX_FAST_PATH_CHARS = 200
# A decimal exponent beyond this makes Fraction arithmetic itself slow; such numbers go to a worker.
_MAX_EXPONENT = 400

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
