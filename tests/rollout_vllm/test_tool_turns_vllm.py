"""Tool turns on the vLLM engine (one engine start): the bigram machine of tests/trainer/test_tool_turns.py makes three
calls; the completion's ids are the ids each round continued from, observations are tool spans, and vLLM's log-probs
stay on the sampled tokens only."""

import pathlib
import sys

import torch
from vllm_reference import ENGINE

from fastrl.tools import ToolResult
from fastrl.trainer.config import make_config
from fastrl.trainer.rollout import make_engine
from fastrl.trainer.rollout.interface import InsertedSpan

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "trainer"))
import test_tool_turns  # noqa: E402
from test_tool_turns import CLOSE, CODE, OPEN, TableSandbox, bigram_model, chain, markup_tokenizer  # noqa: E402


def test_vllm_tool_turns_append_observation_ids_and_keep_the_sampled_logprobs(tmp_path, monkeypatch):
    tok = markup_tokenizer()
    torch.manual_seed(0)
    bigram_model(tok, chain(CODE["six"], again=True)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    config = make_config(model=str(tmp_path), tools="python", max_tool_calls=3, max_completion_length=80,
                         max_prompt_length=8, device="cpu", is_cap=2.0, **ENGINE)  # fmt: skip
    model = bigram_model(tok, chain(CODE["six"], again=True)).eval()
    engine = make_engine("vllm", model, tok, config)
    engine.tools.sandbox = TableSandbox({CODE["six"]: ToolResult("42\n", "ok")})
    rounds = []
    sample = engine._sample

    def recorded(requests, want_logprobs, seeds=None):
        out = sample(requests, want_logprobs, seeds)
        rounds.append([list(ctx) for ctx, _, _ in requests])
        return out

    monkeypatch.setattr(engine, "_sample", recorded)
    prompt = tok.encode("?", add_special_tokens=False)
    comps = engine.generate([prompt], 2, want_logprobs=True, prompt_ids=[0])
    call = tok.encode(OPEN + CODE["six"] + CLOSE, add_special_tokens=False)
    turn = call + tok.encode("\n```output\n42\n\n```\n", add_special_tokens=False)
    spans = tuple(InsertedSpan(k * len(turn) + len(call), (k + 1) * len(turn), "tool") for k in range(3))
    assert len(rounds) == 4
    for c in comps:
        assert c.completion_ids[: 3 * len(turn)] == 3 * turn and c.inserted == spans
        assert c.truncated and len(c.completion_ids) == 80 and c.tool_calls == 3
        for contexts in rounds:
            assert any(ctx == prompt + c.completion_ids[: len(ctx) - len(prompt)] for ctx in contexts)
        inserted = {i for a, b, _ in spans for i in range(a, b)}
        assert all(lp == 0.0 for i, lp in enumerate(c.logprobs) if i in inserted)
        assert all(-1e-3 < lp < 0.0 for i, lp in enumerate(c.logprobs) if i not in inserted)


def test_hermes_calls_read_alike_beside_vllm():
    """The vLLM engine runs the same tool loop in the trainer's process, where vLLM's venv has a transformers of its
    own: there too the hermes calls are what its parse_response reads, and a malformed one is an observation (the
    tool loop on scripted rounds, no engine start)."""
    test_tool_turns.test_hermes_calls_are_what_parse_response_reads_after_the_prompt()
    test_tool_turns.test_a_malformed_hermes_call_is_an_observation()
