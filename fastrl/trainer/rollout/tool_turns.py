"""Multi-turn tool rollouts: sample until a tool call ends, run the tool, append its observation, continue.

Both engines sample in rounds (`sample_with_tools`), like the thinking budget's: each round continues every
unfinished completion from its prompt plus what it has so far. After a round, a completion whose new tokens close a
tool call (the closing fence of a ```` ```python ```` block, or `</tool_call>`) is cut right after the token that
closes it (what it sampled past that point is dropped, its end token included); the round's calls then run together
(user tools in threads, `python` in the sandbox pool, which bounds how many interpreters are alive), and each
observation is appended before the next round, so no completion waits on another's tool between rounds.

Ids are only ever concatenated: the sampled ids, then the observation text tokenized alone (never the decoded whole
tokenized again), so the trainer's ids are the sampler's, token for token. An observation is an `InsertedSpan` of
kind "tool": log-prob 0.0 and an empty kept set, both masked out of every term. A completion ends at an end token,
at `max_completion_length` (an observation that would pass it is cut there, and the completion is truncated), or
goes on without running tools once it has made `max_tool_calls` calls. A tool's error or timeout is its observation.
"""

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fastrl.tools import (
    HERMES_START,
    LocalSandbox,
    Sandbox,
    ToolCall,
    ToolResult,
    call_tool,
    hermes_call,
    last_python_block,
    output_block,
    truncate_observation,
)

from ..batching import KeptSets
from ..tool_options import resolve_tools, tool_schemas
from .interface import Completion, InsertedSpan
from .thinking import Sampled

__all__ = ["ToolCompletion", "ToolTurns", "sample_with_tools", "tool_metrics", "tool_sums", "tool_turns_of"]

_MAX_THREADS = 64  # user-tool threads and sandbox waits of one round; the sandbox pool bounds interpreters itself


@dataclass
class ToolCompletion(Completion):
    tool_calls: int = 0  # calls run (malformed ones included: their observation says what is wrong)
    tool_errors: int = 0  # calls whose status was "error"
    tool_timeouts: int = 0  # calls whose status was "timeout"
    tool_time_s: float = 0.0  # seconds of this completion's calls, submission to result (a slot wait included)


@dataclass
class ToolTurns:
    tools: dict[str, Callable | None]  # name -> user function; None for the built-in sandboxed python
    fmt: str  # "code" or "hermes" (tool_options.TOOL_FORMATS)
    max_calls: int  # calls per completion
    timeout_s: float  # wall-clock limit of one call
    memory_mb: int  # address-space limit of one python call
    tokenizer: object  # decodes sampled ids to find calls; encodes observations alone
    sandbox: Sandbox = field(default_factory=LocalSandbox)
    schemas: tuple[dict, ...] = ()  # the tools' JSON schemas (hermes): they type a call's arguments

    def find_call(self, text: str, prefix: str = "") -> ToolCall | None:
        """The call that `text` (a completion's part since its last observation) closes, or None. `prefix`: the text
        before it (the prompt and the completion so far), where the hermes parser finds the assistant turn's start
        (a `<think>` the template opened makes a call inside it thinking); the code format reads `text` alone."""
        if self.fmt == "code":
            return last_python_block(text)
        return hermes_call(text, prefix=prefix, tools=self.schemas)

    def run(self, call: ToolCall) -> tuple[ToolResult, float]:
        """The call's result (a malformed or unknown call, an error, a timeout: all observations) and its seconds."""
        t0 = time.perf_counter()
        if call.error is not None:
            return ToolResult(call.error, "error"), 0.0
        if call.name not in self.tools:
            return ToolResult(f"unknown tool {call.name!r}; the tools are {', '.join(self.tools)}", "error"), 0.0
        fn = self.tools[call.name]
        if fn is None:
            code = call.arguments.get("code")
            if not isinstance(code, str) or set(call.arguments) != {"code"}:
                return ToolResult(f'python takes {{"code": str}}, got {call.arguments!r}', "error"), 0.0
            result = self.sandbox.run(code, timeout_s=self.timeout_s, memory_mb=self.memory_mb)
        else:
            result = _call_in_time(fn, call.arguments, self.timeout_s)
        return result, time.perf_counter() - t0

    def observation_ids(self, result: ToolResult) -> list[int]:
        """The observation's token ids: its text (cut from the middle to `OBSERVATION_CHARS`, a timeout said at its
        end) in the format's markup, tokenized alone."""
        text = result.output
        if result.status == "timeout":
            text += f"\n[timed out after {self.timeout_s:g} s]"
        text = truncate_observation(text)
        text = output_block(text) if self.fmt == "code" else chat_observation(self.tokenizer, text)
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def _call_in_time(fn: Callable, arguments: dict, timeout_s: float) -> ToolResult:
    """A user tool in a thread of its own, waited on for `timeout_s`: past it the call is a timeout (the thread, which
    Python cannot stop, is left to finish; its result is dropped)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(call_tool, fn, arguments)
    pool.shutdown(wait=False)
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        return ToolResult("", "timeout")


_MARK = "\u2063fastrl-assistant\u2063"


def chat_observation(tokenizer, text: str) -> str:
    """What the chat template writes between an assistant turn's last word and the next assistant turn's first, with
    a `tool` message holding `text` between them (the end of the turn, the tool message, the generation prompt)."""
    turns = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _MARK}]
    before = tokenizer.apply_chat_template(turns, tokenize=False)
    after = tokenizer.apply_chat_template(turns + [{"role": "tool", "content": text}], tokenize=False,
                                          add_generation_prompt=True)  # fmt: skip
    if _MARK not in before or not after.startswith(before):
        raise ValueError("the tokenizer's chat template does not append a tool message after an assistant turn")
    return before[before.rindex(_MARK) + len(_MARK) :] + after[len(before) :]


def tool_turns_of(config, tokenizer, given: list[Callable] | None = None) -> ToolTurns | None:
    """The config's tools (None when `tools` is "" and none are `given`)."""
    tools = resolve_tools(config.tools, given)
    if not tools:
        return None
    if config.tool_format == "hermes":
        _check_hermes(tokenizer)
    return ToolTurns(tools, config.tool_format, config.max_tool_calls, config.tool_timeout_s, config.tool_memory_mb,
                     tokenizer, schemas=tool_schemas(config, given))  # fmt: skip


def _check_hermes(tokenizer) -> None:
    """Transformers' response parser is installed, and the chat template's generation prompt starts a ChatML assistant
    turn: the parser reads the prefix from its last one on (else the whole prompt, the template's example calls
    included, would be read as the model's)."""
    hermes_call("", prefix="")  # ImportError now, naming the version, where transformers has no response parser
    turn = [{"role": "user", "content": "?"}]
    try:
        prompt = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
    except ValueError as error:
        raise ValueError(f"tool_format='hermes' needs the tokenizer's chat template: {error}") from None
    if HERMES_START not in prompt[len(tokenizer.apply_chat_template(turn, tokenize=False)) :]:
        raise ValueError(f"tool_format='hermes' reads ChatML assistant turns ({HERMES_START!r}); the chat "
                         f"template's generation prompt ends {prompt[-40:]!r}")  # fmt: skip


@dataclass
class _Draft:
    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    kept: list[KeptSets] | None = field(default_factory=list)  # one per piece; None once a round gave none
    spans: list[InsertedSpan] = field(default_factory=list)
    done: bool = False
    truncated: bool = False
    rounds: int = 0
    results: list[tuple[ToolResult, float]] = field(default_factory=list)


def _close_at(turns: ToolTurns, d: _Draft, start: int) -> tuple[int, ToolCall] | None:
    """(the length `d.ids` is cut to, the call) when the ids sampled from `start` on close a tool call, else None."""
    since = d.spans[-1].end if d.spans else 0
    decode = turns.tokenizer.decode
    prefix = decode(d.prompt + d.ids[:since]) if turns.fmt == "hermes" else ""
    call = turns.find_call(decode(d.ids[since:]), prefix)
    if call is None:
        return None
    if turns.fmt == "hermes":  # a closed <tool_call> stays the first closed one as text grows: bisect for its token
        lo, hi = start + 1, len(d.ids)
        while lo < hi:
            mid = (lo + hi) // 2
            found = turns.find_call(decode(d.ids[since:mid]), prefix)
            lo, hi, call = (mid + 1, hi, call) if found is None else (lo, mid, found)
        return hi, call
    # a code block found at one length may not be at a longer one (the model can write an ```output block itself)
    for end in range(start + 1, len(d.ids) + 1):  # the first token that closes it
        call = turns.find_call(decode(d.ids[since:end]), prefix)
        if call is not None:
            return end, call
    return None


def sample_with_tools(
    prompts: list[list[int]],
    n: int,
    turns: ToolTurns,
    max_new: int,
    min_new: int,
    end_ids: set[int],
    sample_round: Callable[..., list[Sampled]],
    want_logprobs: bool = False,
    seed_of: Callable[[int, int, int], int] | None = None,
) -> list[ToolCompletion]:
    """`n` completions per prompt with tool turns; `sample_round` samples one batch of (context, most new, fewest
    before an end token) requests, seeded by `seed_of(prompt index, sample, request)` when given."""
    drafts = [_Draft(list(p)) for p in prompts for _ in range(n)]
    with concurrent.futures.ThreadPoolExecutor(min(_MAX_THREADS, max(1, len(drafts)))) as pool:
        while active := [(i, d) for i, d in enumerate(drafts) if not d.done]:
            requests = [(d.prompt + d.ids, max_new - len(d.ids), max(0, min_new - len(d.ids))) for _, d in active]
            if seed_of is None:
                sampled = sample_round(requests)
            else:
                sampled = sample_round(requests, [seed_of(i // n, i % n, d.rounds) for i, d in active])
            calls = []
            for (_, d), (new, lps, kept) in zip(active, sampled):
                start = len(d.ids)
                d.ids += new
                d.logprobs += lps if lps is not None else [0.0] * len(new)
                d.kept = None if d.kept is None or kept is None else d.kept + [kept]
                d.rounds += 1
                closed = _close_at(turns, d, start) if len(d.results) < turns.max_calls else None
                if closed is not None:
                    at, call = closed
                    d.ids, d.logprobs = d.ids[:at], d.logprobs[:at]
                    if d.kept is not None:
                        d.kept = [KeptSets.cat(d.kept).head(at)]
                    calls.append((d, pool.submit(turns.run, call)))
                    continue
                ended = bool(new) and new[-1] in end_ids
                d.done = ended or len(d.ids) >= max_new or not new  # (an engine that samples nothing: no loop)
                d.truncated = not ended and d.done
            for d, future in calls:  # every call of the round runs at once; each ends in its timeout
                result = future.result()
                d.results.append(result)
                obs = turns.observation_ids(result[0])[: max_new - len(d.ids)]
                d.spans.append(InsertedSpan(len(d.ids), len(d.ids) + len(obs), "tool"))
                d.ids += obs
                d.logprobs += [0.0] * len(obs)
                if d.kept is not None:
                    d.kept.append(KeptSets.empty(len(obs)))
                d.done = d.truncated = len(d.ids) >= max_new
    return [_completion(d, want_logprobs) for d in drafts]


def _completion(d: _Draft, want_logprobs: bool) -> ToolCompletion:
    statuses = [r.status for r, _ in d.results]
    return ToolCompletion(
        d.prompt, d.ids, d.truncated, d.logprobs if want_logprobs else None, tuple(d.spans),
        None if d.kept is None else KeptSets.cat(d.kept), tool_calls=len(d.results),
        tool_errors=statuses.count("error"), tool_timeouts=statuses.count("timeout"),
        tool_time_s=sum(t for _, t in d.results),
    )  # fmt: skip


def tool_sums(completions) -> dict:
    """This rank's additive tool statistics of a batch ({} without tool turns); `tool_metrics` reads their sums."""
    if not completions or not isinstance(completions[0], ToolCompletion):
        return {}
    return {
        "tool_calls": sum(c.tool_calls for c in completions),
        "tool_errors": sum(c.tool_errors for c in completions),
        "tool_timeouts": sum(c.tool_timeouts for c in completions),
        "tool_time_s": sum(c.tool_time_s for c in completions),
    }


def tool_metrics(sums: dict) -> dict:
    """`tool_calls_mean` (per completion), `tool_errors_frac` (of calls), `tool_timeouts` and `tool_time_s` (the
    batch's, all ranks) from the (all-ranks) sums with `n` completions; {} without tool turns."""
    if "tool_calls" not in sums:
        return {}
    return {
        "tool_calls_mean": sums["tool_calls"] / sums["n"],
        "tool_errors_frac": sums["tool_errors"] / max(sums["tool_calls"], 1),
        "tool_timeouts": sums["tool_timeouts"],
        "tool_time_s": sums["tool_time_s"],
    }
