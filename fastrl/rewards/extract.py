"""Answer extraction: the final answer of a completion (last box, else an "answer is" marker).

Plain Python (``re``), linear in the input's length, no sympy: it runs in the calling process.
"""

from __future__ import annotations

import re

__all__ = ["extract_answer"]

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
