"""String side of the math verifier: normalization and a numeric fast path (exact rationals).

Everything here is plain Python (``re`` and ``fractions``), runs in bounded time on bounded input and never
imports sympy, so the calling process uses it directly to decide plain numbers without a worker.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

__all__ = [
    "APPROX_MIN_DIGITS",
    "divides_by_zero",
    "INVALID",
    "MAX_FAST_PATH_CHARS",
    "normalize",
    "percent_readings",
    "plain_number",
    "quick_equal",
    "split_marker",
    "undouble_backslashes",
    "unit_of",
    "units_conflict",
]

# Inputs longer than this skip the in-process fast path and go to a worker, where a time limit applies.
MAX_FAST_PATH_CHARS = 200
# A decimal exponent beyond this makes Fraction arithmetic itself slow; such numbers go to a worker.
_MAX_EXPONENT = 400

_UNICODE_MATH = str.maketrans(
    {"−": "-", "×": "\\times ", "·": "\\cdot ", "÷": "/", "π": "\\pi ", "∞": "\\infty ", "√": "\\sqrt "}
)
_TEXT_COMMANDS = "text|textbf|textit|textrm|textsf|texttt|textnormal|textup|mathrm|mathbf|mathit|mathsf|mathtt|mbox"
_TEXT_RE = re.compile(rf"\\(?:{_TEXT_COMMANDS}|operatorname\*?)\s*\{{([^{{}}]*)\}}")
_UNITS = (
    "cm|mm|km|m|meters?|centimeters?|millimeters?|kilometers?|in|inch|inches|ft|feet|foot|yd|yards?|mi|miles?|"
    "kg|g|grams?|kilograms?|lbs?|pounds?|oz|ounces?|s|sec|seconds?|min|minutes?|h|hr|hrs|hours?|days?|weeks?|"
    "months?|years?|units?|square|sq|cubic|dollars?|cents?|mph|liters?|l|ml|gallons?|degrees?|people|students|"
    "points?|ways|times"
)
# Word boundaries keep the repetition unambiguous ("mmm" is not "m" "m" "m"), so matching stays linear.
_TRAILING_UNIT_RE = re.compile(rf"(?<=[\d}}])\s*(?:\b(?:{_UNITS})\b(?:\^\{{?[23]\}}?|²|³)?\s*)+$", re.IGNORECASE)
# "1,234" is a number; "0,5" and "1, 234" (with a space) are not thousands.
_THOUSANDS_RE = re.compile(r"^([-+]?)([1-9]\d{0,2}(?:,\d{3})+|[1-9]\d{0,2}(?: \d{3})+)(\.\d+)?$")
_MIXED_RE = re.compile(r"^([-+]?)([1-9]\d{0,2}(?: \d{3})+|\d+) (\d+) ?/ ?(\d+)$")
_SPACING_RE = re.compile(r"\\\\|(\\!\s*|\\,|\{,\})|\\[;:>]|\\q?quad|~|\\ ")
_NEQ_RE = re.compile(r"\\neq?(?![a-zA-Z])|!=|≠|\\not\s*=")
# A marker that no answer equals: a mixed number whose parts do not make one (4 4/0, 11 7/6).
INVALID = "\x00invalid"

_UNIT_NAMES = {
    "cm": "centimeter centimeters centimetre centimetres",
    "mm": "millimeter millimeters millimetre millimetres",
    "km": "kilometer kilometers kilometre kilometres",
    "m": "meter meters metre metres",
    "in": "inch inches",
    "ft": "feet foot",
    "yd": "yard yards",
    "mi": "mile miles",
    "kg": "kilogram kilograms",
    "g": "gram grams",
    "lb": "lbs pound pounds",
    "oz": "ounce ounces",
    "s": "sec second seconds",
    "min": "minute minutes",
    "h": "hr hrs hour hours",
    "day": "days",
    "week": "weeks",
    "month": "months",
    "year": "years",
    "l": "liter liters litre litres",
    "ml": "milliliter milliliters",
    "gal": "gallon gallons",
    "mph": "",
}
_UNIT_CANON = {alias: unit for unit, aliases in _UNIT_NAMES.items() for alias in (unit, *aliases.split())}
_UNIT_AT_END_RE = re.compile(
    rf"(?<=[\d}}$ ])\s*(?:\\(?:{_TEXT_COMMANDS})\s*\{{\s*([a-zA-Z]+)\s*\}}|([a-zA-Z]+))"
    r"\s*(\^\s*\{?[23]\}?|²|³)?\s*\.?\s*$"
)


def undouble_backslashes(text: str) -> str:
    """Text whose LaTeX was escaped twice ("\\\\frac{1}{2}" for "\\frac{1}{2}") with each backslash pair halved."""
    if "\\\\" in text and re.search(r"\\\\[a-zA-Z]", text) and not re.search(r"(?<!\\)\\[a-zA-Z]", text):
        return text.replace("\\\\", "\\")
    return text


def unit_of(answer: str) -> str | None:
    """The unit an answer ends in ("5 \\text{ cm}" -> "cm", "3 square feet" -> "ft^2"), None if none is known."""
    s = answer.strip().rstrip("$").rstrip()
    m = _UNIT_AT_END_RE.search(s[-80:])
    if m is None:
        return None
    unit = _UNIT_CANON.get(m.group(1) or m.group(2)) or _UNIT_CANON.get((m.group(1) or m.group(2)).lower())
    if unit is None:
        return None
    sup = m.group(3) or ""
    power = "2" if ("2" in sup or "²" in sup) else "3" if ("3" in sup or "³" in sup) else ""
    before = s[-80:][: m.start()].rstrip().lower()
    if before.endswith(("square", "sq", "sq.")):
        power = "2"
    elif before.endswith("cubic"):
        power = "3"
    return f"{unit}^{power}" if power else unit


def _mixed_number(s: str) -> str:
    """ "4 4/9" -> "\\frac{40}{9}"; a whole part with a fraction that is not proper is INVALID."""
    m = _MIXED_RE.match(s)
    if m is None:
        return s
    sign, whole, num, den = m.group(1), int(m.group(2).replace(" ", "")), int(m.group(3)), int(m.group(4))
    if den == 0 or num >= den:
        return INVALID
    return f"{'-' if sign == '-' else ''}\\frac{{{whole * den + num}}}{{{den}}}"


def _matrix(s: str) -> str:
    s = re.sub(r"\\begin\{(?:[bBp]?matrix|smallmatrix|array)\}(?:\{[^{}]*\})?", r"\\begin{pmatrix}", s)
    s = re.sub(r"\\end\{(?:[bBp]?matrix|smallmatrix|array)\}", r"\\end{pmatrix}", s)
    s = re.sub(r"\\\\\s*(?=\\end\{pmatrix\})", "", s)  # a row separator before the end adds no row
    m = re.fullmatch(r"[\[(]\s*(\\begin\{pmatrix\}.*\\end\{pmatrix\})\s*[\])]", s, re.DOTALL)
    return m.group(1) if m and m.group(1).count("\\begin") == 1 else s


_LINE_BETWEEN_NUMBERS_RE = re.compile(r"(?<=\d)[ \t]*\r?\n\s*(?=[-+\d])")
_SIZING_RE = re.compile(r"\\(?:displaystyle|left|right|bigl?|bigr?|Bigl?|Bigr?)(?![a-zA-Z])")
_FRAC_VARIANT_RE = re.compile(r"\\[dtc]frac")
_FRAC_BARE_ARG_RE = re.compile(r"\\frac\s*([0-9a-zA-Z])")
_FRAC_BARE_DEN_RE = re.compile(r"\\frac(\{[^{}]*\})\s*([0-9a-zA-Z])")
_SQRT_BARE_ARG_RE = re.compile(r"\\sqrt\s*([0-9a-zA-Z])")
_CONJUNCTION_RE = re.compile(r"\\text\{\s*(?:and|or)\s*\}|\s+(?:and|or)\s+|(?<=[\d)}])or(?=[a-zA-Z(\\\d-])")
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree|°|\s*degrees?$")
_PERCENT_RE = re.compile(r"\\%|%|\s*(?:percentage|percent|pct)$")
_CURRENCY_RE = re.compile(r"\s*(?:dollars?|USD|€|£)$")
_SPACED_PERCENT_RE = re.compile(r"\s+%$")
_TEXT_WITH_POWER_RE = re.compile(_TEXT_RE.pattern + r"(?:\^\{?[23]\}?)?")
_SPACES_RE = re.compile(r"\s+")
_INFINITY_RE = re.compile(r"\b(?:infinity|inf)\b")
_EMPTY_SET_RE = re.compile(r"\\\{\s*\\\}|\\varnothing|\\O|\{\s*\}")
_LETTER_RE = re.compile(r"[a-zA-Z]")
# Answers up to this length are normalized once and cached (a group's gold answer, repeated answers).
_CACHED_CHARS = 1024


def normalize(answer: str) -> str:
    """Canonical text of one answer: math delimiters, spacing, text/units, currency, degrees, percent.

    Percent becomes a trailing ``%`` and degrees a trailing ``°``, for the comparison to read either way.
    """
    return _normalize_cached(answer) if len(answer) <= _CACHED_CHARS else _normalize(answer)


@functools.lru_cache(maxsize=16384)
def _normalize_cached(answer: str) -> str:
    return _normalize(answer)


def _normalize(answer: str) -> str:
    s = undouble_backslashes(answer.strip()).translate(_UNICODE_MATH)
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            s = s[len(left) : len(s) - len(right)].strip()
    s = s.replace("\\$", "").replace("$", "")
    if "\n" in s:
        s = _LINE_BETWEEN_NUMBERS_RE.sub(" \\\\newline ", s)  # "11\n5/6" is not a mixed number
    latex = "\\" in s
    if latex:
        s = _SIZING_RE.sub("", s)
    if latex or "~" in s or "{,}" in s:
        # Spacing commands go; a row break "\\\\" is kept whole (its second backslash is no "\\ " or "\\,").
        s = _SPACING_RE.sub(lambda m: m.group() if m.group() == "\\\\" else "" if m.group(1) else " ", s)
    if latex:
        s = _FRAC_VARIANT_RE.sub(r"\\frac", s)
        s = _FRAC_BARE_ARG_RE.sub(r"\\frac{\1}", s)
        s = _FRAC_BARE_DEN_RE.sub(r"\\frac\1{\2}", s)
        s = _SQRT_BARE_ARG_RE.sub(r"\\sqrt{\1}", s)
        s = s.replace("\\le ", "\\leq ").replace("\\ge ", "\\geq ")
    if latex or "=" in s or "≠" in s:
        s = _NEQ_RE.sub(r"\\neq ", s)
    letters = _LETTER_RE.search(s) is not None
    if letters:
        s = _CONJUNCTION_RE.sub(",", s)
    if latex or letters or "°" in s:
        s = _DEGREE_RE.sub("°", s)
    if letters or "%" in s:
        s = _PERCENT_RE.sub("%", s)
        s = _SPACED_PERCENT_RE.sub("%", s)
    if letters or "€" in s or "£" in s:
        s = _CURRENCY_RE.sub("", s)
    if latex:
        # \text{...}: units after a value are dropped; an answer that is only text keeps its words.
        without_text = _TEXT_WITH_POWER_RE.sub("", s).strip()
        s = without_text if without_text and without_text not in "-+" else _TEXT_RE.sub(r"\1", s)
    if letters:
        s = _TRAILING_UNIT_RE.sub("", s)
    s = _SPACES_RE.sub(" ", s).strip().rstrip(".,;").strip()
    if letters:
        s = _INFINITY_RE.sub(r"\\infty", s)
    if _EMPTY_SET_RE.fullmatch(s):
        s = "\\emptyset"
    if "\\begin" in s:
        s = _matrix(s)
    value, marker = split_marker(s)
    m = _THOUSANDS_RE.match(value)
    if m:
        value = m.group(1) + value[m.start(2) : m.end(2)].replace(",", "").replace(" ", "") + (m.group(3) or "")
    value = _mixed_number(value)
    return value + marker if value != INVALID else INVALID


_NUMBER_RE = re.compile(
    r"^([-+]?)\s*(\d+(?:\.\d*)?|\.\d+)(?:\s*(?:e|E|\\times\s*10\s*\^|\\cdot\s*10\s*\^)\s*\{?\s*([-+]?\d+)\s*\}?)?$"
)
_FRAC_RE = re.compile(r"^([-+]?)\\frac\{([-+]?\d+)\}\{(\d+)\}$|^([-+]?\d+)\s*/\s*(\d+)$")


def plain_number(s: str) -> Fraction | None:
    """The exact value of a plain numeral (integer, decimal, scientific, integer fraction), else None."""
    s = s.strip()
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


_DIVISION_BY_ZERO_RE = re.compile(r"/\s*\(?\s*0+(?![\d.])|\\frac\s*\{[^{}]*\}\s*\{\s*0+\s*\}")


def divides_by_zero(s: str) -> bool:
    """ "1/0", "\\frac{0}{0}": undefined, so equal to nothing, itself included."""
    return _DIVISION_BY_ZERO_RE.search(s) is not None


def units_conflict(pred: str, gold: str) -> bool:
    """Both answers name a unit, and not the same one ("5 m" against "5 cm")."""
    a, b = unit_of(pred), unit_of(gold)
    return a is not None and b is not None and a != b


def percent_readings(value_text: str, marker: str, other_text: str, other_marker: str) -> tuple[bool, bool]:
    """Which readings of a percent count against the other side: (as written, divided by 100).

    "28%" answers "28" (datasets drop the sign) and "0.28"; but against a fraction ("40/9") only v/100 counts,
    since a percent sign a gold answer dropped sits on a plain number. With the sign on both sides, or neither,
    the written values compare.
    """
    if marker == other_marker or "%" not in (marker, other_marker):
        return True, False
    plain = other_text if marker == "%" else value_text
    return _PLAIN_DECIMAL_RE.match(plain) is not None, True


_PLAIN_DECIMAL_RE = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)$")


_LONG_DECIMAL_RE = re.compile(r"^[-+]?(\d+)\.(\d+)$")
# A decimal with this many significant digits that matches an exact value to its last digit is that value.
APPROX_MIN_DIGITS = 10


def _approximates(decimal_text: str, value: Fraction) -> bool:
    """ "0.0833333333333333" for 1/12: 10+ significant digits, off by less than one unit in the last place."""
    m = _LONG_DECIMAL_RE.match(decimal_text)
    if m is None or len((m.group(1) + m.group(2)).lstrip("0")) < APPROX_MIN_DIGITS:
        return False
    return abs(Fraction(decimal_text) - value) < Fraction(1, 10 ** len(m.group(2)))


def quick_equal(pred: str, gold: str) -> bool | None:
    """Decide cheaply when both answers are plain numbers (exact rational comparison); None when undecided."""
    if len(pred) > MAX_FAST_PATH_CHARS or len(gold) > MAX_FAST_PATH_CHARS:
        return None
    p, g = normalize(pred), normalize(gold)
    if INVALID in (p, g):
        return False
    if units_conflict(pred, gold):
        return False
    if p == g and p and not divides_by_zero(p):
        return True
    values = []
    for text in (p, g):
        value_text, marker = split_marker(text)
        value = plain_number(value_text)
        if value is None:
            return None
        # A rational number of degrees is a rational number of radians only at 0, so v*pi/180 adds nothing.
        values.append((value, value_text, marker))
    (a, a_text, a_marker), (b, b_text, b_marker) = values
    if a != b and not a_marker and not b_marker and (_approximates(a_text, b) or _approximates(b_text, a)):
        return True
    if a_marker == "%" and b_marker != "%":
        written, scaled = percent_readings(a_text, a_marker, b_text, b_marker)
        return (written and a == b) or (scaled and a / 100 == b)
    if b_marker == "%" and a_marker != "%":
        written, scaled = percent_readings(b_text, b_marker, a_text, a_marker)
        return (written and a == b) or (scaled and b / 100 == a)
    return a == b
