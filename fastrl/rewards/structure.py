"""The structure of a normalized answer: leaves, equations, and sequences (sets, tuples, intervals, lists).

Plain Python; the comparison of the pieces is in ``verify``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Equation", "Leaf", "Seq", "inequality_interval", "parse_structure"]


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
