"""Answer extraction: the final answer of a completion (its boxes, else an "answer is" marker).

Linear time on any input: every scan is a single left-to-right pass (``re.finditer`` over tokens, ``str.find``),
with no pattern that can backtrack, so a degenerate completion cannot stall the caller. No sympy: this runs in
the calling process.
"""

from __future__ import annotations

import re

from .normalize import undouble_backslashes

__all__ = ["answer_of", "extract_answer", "gold_answer"]

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
# One token of brace matching: an escaped character (so "\{" and "\\" never count) or a brace.
_BRACE_TOKEN_RE = re.compile(r"\\.|[{}]", re.DOTALL)
_MARKER_RE = re.compile(r"(?:final\s+answer|answer)(?:\s*(?:is|:)|(?=[ \t]*(?:\$|\\\(|\\\[)))", re.IGNORECASE)
# Math delimiters ($ not escaped), sentence ends outside math, "I hope it is correct." boilerplate.
_MATH_TOKEN_RE = re.compile(r"(?<!\\)\$\$|(?<!\\)\$|\\\(|\\\)|\\\[|\\\]")
_CLOSER = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
_INLINE = ("$", "\\(")
_SENTENCE_END_RE = re.compile(r"\.(?=\s|$)|\n|\bI hope it is correct", re.IGNORECASE)
_IS_RE = re.compile(r"\s(?:is|are|equals|=)\s", re.IGNORECASE)
_NUMBER_RE = re.compile(r"[-+]?(?:\d+ (?=\d+\s*/\s*\d))?\d+(?:[.,]\d+)*(?:\s*/\s*\d+)?(?:\s*%)?")
_WORD_RE = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}")
_NESTED_BOX_RE = re.compile(r"(?:\s*\\(?:boxed|fbox)\s*\{)+")
_CONNECTIVE_NOISE_RE = re.compile(r"\\[a-zA-Z]+|[^a-zA-Z]")
# What follows a marker (or ends a completion) that the answer is looked for in; longer is no one answer.
_MAX_MARKED_CHARS = 4096
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def _box_spans(text: str) -> tuple[list[tuple[int, int, int]], int]:
    """(command start, content start, content end) of each outermost box, and where an unclosed last box's
    content starts (-1 if none). One pass with a stack of open braces; a box inside a box is part of its content.
    """
    box_opens: dict[int, int] = {}  # brace position -> start of its \boxed command
    for m in _BOX_RE.finditer(text):
        j = m.end()
        while j < len(text) and text[j] in " \t\n":
            j += 1
        if j < len(text) and text[j] == "{":
            box_opens[j] = m.start()
    spans: list[tuple[int, int, int]] = []
    stack: list[int] = []
    outer = -1  # the open brace of the outermost box now open
    for m in _BRACE_TOKEN_RE.finditer(text):
        token, pos = m.group(), m.start()
        if token == "{":
            stack.append(pos)
            if outer < 0 and pos in box_opens:
                outer = pos
        elif token == "}" and stack:
            if stack.pop() == outer:
                spans.append((box_opens[outer], outer + 1, pos))
                outer = -1
    return spans, (outer + 1 if outer >= 0 else -1)


def _connective(between: str) -> bool:
    """Whether the text between two boxes only joins them ("and", ", ", "\\quad \\text{and}", "papers and")."""
    if len(between) > 80:
        return False
    words = _WORD_RE.findall(_CONNECTIVE_NOISE_RE.sub(" ", between))
    return len([w for w in words if w.lower() not in ("and", "or")]) <= 3


def _bare_box_arguments(text: str) -> list[str]:
    # "\boxed 5": the argument is the next token (no braces).
    out = []
    for m in _BOX_RE.finditer(text):
        arg = re.match(r"[ \t]+([^\s${}]+)", text[m.end() : m.end() + 64])
        if arg:
            out.append(arg.group(1))
    return out


def _unwrap(content: str) -> str:
    """``\\boxed{\\boxed{3}}`` -> ``3``: strip the nested box prefixes at once (linear, however deep)."""
    prefix = _NESTED_BOX_RE.match(content)
    if prefix is None:
        return content
    depth = prefix.group().count("{")
    # All levels at once, else only the outermost ("\boxed{\boxed{1}+\boxed{2}}" keeps its inner boxes).
    for k, start in ((depth, prefix.end()), (1, content.index("{") + 1)):
        inner = content[start:].rstrip()
        if inner.endswith("}" * k) and _balanced(inner[: len(inner) - k]):
            return inner[: len(inner) - k].strip()
    return content


def _balanced(text: str) -> bool:
    depth = 0
    for m in _BRACE_TOKEN_RE.finditer(text):
        if m.group() == "{":
            depth += 1
        elif m.group() == "}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def _boxed_answer(text: str, *, allow_unclosed: bool) -> str | None:
    """The answers of every box, deduplicated and joined with ", "; None if there is no box."""
    if not _BOX_RE.search(text):
        return None
    spans, unclosed = _box_spans(text)
    contents = [_unwrap(text[a:b].strip()) for _, a, b in spans]
    joined = all(_connective(text[spans[i][2] + 1 : spans[i + 1][0]]) for i in range(len(spans) - 1))
    if unclosed >= 0:
        if not allow_unclosed:
            return None  # an unclosed box is a truncated answer, not an earlier one
        contents.append(text[unclosed:].strip())
    elif not spans:
        contents = _bare_box_arguments(text)
    unique = list(dict.fromkeys(c for c in contents if c))
    if len(unique) > 1 and not joined:
        return None  # distinct answers boxed apart, with reasoning between: hedging, or no single answer
    return ", ".join(unique) if unique else None


def _math_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each complete math span; inline spans ($...$, \\(...\\)) may not cross a line."""
    spans, open_tok, open_end = [], None, 0
    for m in _MATH_TOKEN_RE.finditer(text):
        tok = m.group()
        if open_tok is None:
            if tok in _CLOSER:
                open_tok, open_end = tok, m.end()
        elif tok == _CLOSER[open_tok]:
            if not (open_tok in _INLINE and "\n" in text[open_end : m.start()]):
                spans.append((open_end, m.start()))
            open_tok = None
    return spans


def _sentence_answer(rest: str) -> str | None:
    """The answer in the text that follows a marker: a math span, else the end of the sentence's claim."""
    rest = rest.lstrip(" \t*:")
    spans = _math_spans(rest)
    if spans and _MATH_TOKEN_RE.match(rest) and _MATH_TOKEN_RE.match(rest).end() == spans[0][0]:
        return rest[spans[0][0] : spans[0][1]].strip().rstrip(".").strip() or None  # it opens with math
    # The sentence: up to its first end outside math.
    cut, k = len(rest), 0
    for m in _SENTENCE_END_RE.finditer(rest):
        while k < len(spans) and spans[k][1] < m.start():
            k += 1
        if k < len(spans) and spans[k][0] <= m.start() < spans[k][1]:
            continue  # inside math
        cut = m.start()
        break
    sentence = rest[:cut]
    in_math = _math_spans(sentence)
    claims = [m for m in _IS_RE.finditer(sentence) if not any(a <= m.start() < b for a, b in in_math)]
    if claims:
        sentence = sentence[claims[-1].end() :]  # "The largest $n$ is 34" -> "34"
    spans = _math_spans(sentence)
    prose = [
        w for w in _WORD_RE.findall(re.sub(r"\$[^$]*\$", "", sentence).replace("\\$", "")) if w not in ("and", "or")
    ]
    if spans and not prose:
        answer = sentence  # only math (and punctuation): keep it whole, normalization drops the delimiters
    elif spans:
        answer = sentence[spans[-1][0] : spans[-1][1]]
    else:
        answer = sentence
        numbers = _NUMBER_RE.findall(answer)
        if len(_WORD_RE.findall(answer)) >= 2 and len(numbers) == 1:
            answer = numbers[0]  # "Jane started growing it 3 hours ago" -> "3"
    answer = answer.replace('\\"', "").strip().strip('*"').rstrip(".").strip()
    return answer or None


def _last_marker(text: str) -> re.Match | None:
    last = None
    for last in _MARKER_RE.finditer(text):
        pass
    return last


def _marked_answer(text: str, last: re.Match | None) -> str | None:
    if last is None:
        return None
    rest = text[last.end() : last.end() + _MAX_MARKED_CHARS].lstrip(" \t*:")
    block = next((tok for tok in ("$$", "\\[") if rest.startswith(tok)), None)
    if block is None:
        line_end = rest.find("\n")
        rest = rest if line_end < 0 else rest[:line_end]
    else:  # display math may span lines
        end = rest.find(_CLOSER[block], len(block))
        if end < 0:
            return None
        return rest[len(block) : end].strip() or None
    return _sentence_answer(rest)


def _lenient_answer(text: str) -> str | None:
    text = text[-_MAX_MARKED_CHARS:]  # the final answer is at the end
    spans = _math_spans(text)
    if spans:
        a, b = spans[-1]
        closing = _MATH_TOKEN_RE.match(text, b)
        after = closing.end() if closing else b
        last = None
        for last in _NUMBER_RE.finditer(text, after):
            pass
        if last is not None and not _MATH_TOKEN_RE.search(text, after):
            return last.group().strip()  # a number stated in prose after the last math
        return text[a:b].strip() or None
    if any(m.group() != "$" for m in _MATH_TOKEN_RE.finditer(text)) or text.count("$") - text.count("\\$") >= 2:
        return None  # math delimiters that never close properly: no reliable answer
    last = None
    for last in _NUMBER_RE.finditer(text):
        pass
    return last.group().strip() if last else None


def extract_answer(text: str, *, lenient: bool = False) -> str | None:
    """The final answer of a completion: its boxes (``\\boxed{...}`` / ``\\fbox{...}``), else an answer marker.

    Several boxes are one answer listing all of them (duplicates dropped): "\\boxed{1} and \\boxed{2}" is
    "1, 2", so a completion that boxes several candidates (hedging) does not pass on its last one. Without a box,
    the last marker ("the final answer is", "Answer:") gives the math span or the claim of its sentence. When the
    completion has a ``</think>``, only the text after the last one counts; an open ``<think>`` that never closes
    means the model never answered.

    Args:
        text: the completion.
        lenient: for evaluation, not rewards: with no box and no marker, fall back to the last math span, else
            the last number (as Math-Verify does). Off for rewards, where a policy should state its answer.
    Returns:
        The answer text, or None when there is no complete answer (no box or marker, an empty box, an unclosed
        brace).
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_answer expects a str, got {type(text).__name__}: {text!r:.80}")
    if _THINK_CLOSE in text:
        text = text.rsplit(_THINK_CLOSE, 1)[1]
    elif _THINK_OPEN in text:
        return None
    text = undouble_backslashes(text)
    marker = _last_marker(text)
    if _BOX_RE.search(text, marker.start() if marker else 0):
        return _boxed_answer(text, allow_unclosed=False)
    # A final-answer statement after every box is the last word ("... \\boxed{200} ... The final answer is 10455").
    answer = _marked_answer(text, marker)
    if answer is None and lenient:
        answer = _lenient_answer(text)
    return answer or None


def gold_answer(gold: str | int | float) -> str:
    """The reference answer in a dataset's gold field: bare ("3/4"), a solution with boxes (MATH), "#### 3/4"
    (GSM8K), or a solution ending in a final-answer marker. A gold answer's last box may run to the end."""
    if isinstance(gold, (int, float)) and not isinstance(gold, bool):
        return str(gold)  # GSM8K-style datasets store numbers
    if not isinstance(gold, str):
        raise TypeError(f"gold must be a str (or a number), got {type(gold).__name__}: {gold!r:.80}")
    if "####" in gold:
        return gold.rsplit("####", 1)[1].strip()
    text = undouble_backslashes(gold)
    answer = _boxed_answer(text, allow_unclosed=True)
    if answer is None and _MARKER_RE.search(text):
        answer = _marked_answer(text, _last_marker(text))
    return answer if answer is not None else gold


def answer_of(pred: str | None) -> str | None:
    """A bare predicted answer as compared: its boxes when it has any ("$\\boxed{1,2}$" -> "1, 2"), else itself."""
    if pred is None or not _BOX_RE.search(pred):
        return pred
    return _boxed_answer(undouble_backslashes(pred), allow_unclosed=False)
