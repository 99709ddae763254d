"""The structure of a normalized answer: leaves, equations, and sequences (sets, tuples, intervals, lists).

Plain Python; the comparison of the pieces is in ``verify``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Equation", "Leaf", "Seq", "inequality_interval", "is_label", "parse_structure"]


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
    if sep not in s:
        return [s]
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


_SUBSCRIPT_RE = re.compile(r"_\{[^{}]*\}|_[a-zA-Z0-9]")
_LABEL_COMMANDS_RE = re.compile(
    r"\\(?:frac|angle|measuredangle|triangle|overline|overrightarrow|vec|hat|bar|mathrm|text|operatorname)(?![a-zA-Z])"
)
_LABEL_RE = re.compile(r"[a-zA-Z()|:,/']+")


def is_label(text: str) -> bool:
    """Whether ``text`` names the quantity an answer gives, not a value: "x", "f(x)", "(p,q)", "|AB|", "V_1:V_2".

    Letters (with subscripts), function applications, tuples of names, ratios and bars; no digits outside
    subscripts and no arithmetic, so "2x" or "x+y" are expressions, not labels.
    """
    t = _LABEL_COMMANDS_RE.sub("", _SUBSCRIPT_RE.sub("", text.strip()))
    t = t.replace("{", "").replace("}", "").replace(" ", "")
    return bool(t) and _LABEL_RE.fullmatch(t) is not None and re.search("[a-zA-Z]", t) is not None


def _brace_group(s: str) -> str | None:
    """The inside of "{...}" when one plain brace pair spans the whole string (LaTeX grouping: "{1,3}")."""
    if not (s.startswith("{") and s.endswith("}")):
        return None
    depth = 0
    for i, c in enumerate(s):
        depth += 1 if c == "{" and s[i - 1 : i] != "\\" else -1 if c == "}" and s[i - 1 : i] != "\\" else 0
        if depth == 0 and i < len(s) - 1:
            return None
    return s[1:-1]


def _items(inner: str) -> list[str]:
    items = _split_top(inner, ",")
    return items if len(items) > 1 else _split_top(inner, ";")  # "(0;-2;6)" is a triple


def parse_structure(s: str) -> Leaf | Equation | Seq:
    """The structure of a normalized answer (sets, tuples, intervals, unions, lists, equations, leaves)."""
    s = re.sub(r"^[a-zA-Z](?:_\{?\w+\}?)?\s*\\in\s*", "", s.strip())
    groups = _split_top(s, ";")  # "p=5,q=2; p=7,q=2": a list of answers that are lists themselves
    if len(groups) > 1 and all(g.strip() for g in groups):
        return Seq(tuple(parse_structure(g) for g in groups), "", "")
    union = _split_top(s, "\\cup")
    if len(union) > 1:
        return Seq(tuple(parse_structure(p) for p in union), "u", "u")
    grouped = _brace_group(s)
    if grouped is not None and grouped.strip():
        return parse_structure(grouped)  # "{1,3}" renders as "1,3": a plain list, not a set
    enclosed = _enclosing(s)
    if enclosed is not None:
        open_, inner, close = enclosed
        items = _items(inner)
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
    if len(sides) >= 2 and not any(re.search(r"[<>!\\]$", side) for side in sides[:-1]):
        # A chain "x = 5+5+1 = 11" states its result last: the answer is (its label, or the step before) = last.
        lhs = sides[0] if len(sides) == 2 or is_label(sides[0]) else sides[-2]
        return Equation(lhs.strip(), sides[-1].strip())
    return Leaf(s.strip())


# relation -> (direction, closed)
_RELATIONS = {"<": ("<", False), "\\lt": ("<", False), ">": (">", False), "\\gt": (">", False)}
_RELATIONS |= {op: ("<", True) for op in ("<=", "\\le", "\\leq", "\\leqslant", "≤")}
_RELATIONS |= {op: (">", True) for op in (">=", "\\ge", "\\geq", "\\geqslant", "≥")}
_RELATION_RE = re.compile(
    "("
    + "|".join(
        re.escape(op) + ("(?![a-zA-Z])" if op[0] == "\\" else "") for op in sorted(_RELATIONS, key=len, reverse=True)
    )
    + ")"
)
_ABS_RE = re.compile(r"\|(.+)\|")


def _is_variable(text: str) -> bool:
    return is_label(text) and ":" not in text and "," not in text


def _abs_union(lo: str | None, hi: str | None, closed_lo: bool, closed_hi: bool) -> Seq:
    """The set of v with lo < |v| < hi (either bound may be absent): one interval or a union of two."""
    if lo is None:  # |v| < hi
        return Seq((Leaf(f"-({hi})"), Leaf(hi)), "[" if closed_hi else "(", "]" if closed_hi else ")")
    lo_open, lo_close = ("[" if closed_lo else "("), ("]" if closed_lo else ")")
    if hi is None:  # |v| > lo
        left = Seq((Leaf("-\\infty"), Leaf(f"-({lo})")), "(", lo_close)
        right = Seq((Leaf(lo), Leaf("\\infty")), lo_open, ")")
    else:
        hi_open, hi_close = ("[" if closed_hi else "("), ("]" if closed_hi else ")")
        left = Seq((Leaf(f"-({hi})"), Leaf(f"-({lo})")), hi_open, lo_close)
        right = Seq((Leaf(lo), Leaf(hi)), lo_open, hi_close)
    return Seq((left, right), "u", "u")


def inequality_interval(s: str) -> Seq | None:
    """The set a one-variable inequality describes ("x > 3" -> (3, inf), "1 <= x < 2" -> [1, 2)), or None.

    The variable may be a label ("0 < f(x) < 1") or an absolute value ("|z| < 1" -> (-1, 1), "1 <= |z| <= 2" ->
    [-2, -1] u [1, 2]).
    """
    tokens = [t.strip() for t in _RELATION_RE.split(s)]
    ops = [_RELATIONS[op] for op in tokens[1::2]]
    values = tokens[0::2]
    if len(values) == 2:
        if _is_variable(values[1]) and not _is_variable(values[0]):
            values.reverse()  # "3 < x" is "x > 3"
            ops = [(">" if ops[0][0] == "<" else "<", ops[0][1])]
        if not _is_variable(values[0]):
            return None
        (direction, closed), bound = ops[0], values[1]
        if _ABS_RE.fullmatch(values[0]):
            return (
                _abs_union(bound, None, closed, False) if direction == ">" else _abs_union(None, bound, False, closed)
            )
        if direction == ">":
            return Seq((Leaf(bound), Leaf("\\infty")), "[" if closed else "(", ")")
        return Seq((Leaf("-\\infty"), Leaf(bound)), "(", "]" if closed else ")")
    if len(values) == 3 and _is_variable(values[1]) and ops[0][0] == ops[1][0]:
        (direction, closed_lo), (_, closed_hi) = ops
        lo, hi = values[0], values[2]
        if direction == ">":
            lo, hi, closed_lo, closed_hi = hi, lo, closed_hi, closed_lo
        if _ABS_RE.fullmatch(values[1]):
            return _abs_union(lo, hi, closed_lo, closed_hi)
        return Seq((Leaf(lo), Leaf(hi)), "[" if closed_lo else "(", "]" if closed_hi else ")")
    return None
