"""Multi-turn tool rollouts on the HF engine, with a model that writes a fixed chain of tokens (a bigram machine: each
token's successor is fixed), so each test knows which calls the completion makes."""

import string
import time

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from fastrl.tools import HERMES_RESPONSE_TEMPLATE, ToolCall, ToolResult
from fastrl.trainer import scoring, sources
from fastrl.trainer.config import make_config
from fastrl.trainer.metrics import read_metrics
from fastrl.trainer.rollout import HFEngine
from fastrl.trainer.rollout.interface import Completion, InsertedSpan
from fastrl.trainer.rollout.tool_turns import ToolCompletion, sample_with_tools, tool_sums, tool_turns_of
from fastrl.trainer.trainer import train

OPEN, CLOSE = "```python\n", "```"
CODE = {"six": "print(6*7)\n", "zero": "1/0\n", "loop": "while 1: pass\n"}
HERMES = ("<tool_call>\n", '{"name": "word_count", "arguments": {"text": "a b c"}}', "\n</tool_call>")
NAP = '{"name": "nap", "arguments": {}}'  # a call of a user tool that outlives its timeout
CHATML_START = "<|im_start|>assistant\n"
GENERATION = "{% if add_generation_prompt %}" + CHATML_START + "{% endif %}"
CHATML = (
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}" + GENERATION
)


def word_count(text: str) -> int:
    """The number of words in a text.

    Args:
        text: the text whose words are counted.
    """
    return len(text.split())


def nap() -> str:
    """Sleeps past the test's tool timeout."""
    time.sleep(3.0)
    return "rested"


def markup_tokenizer():
    chars = sorted(set(string.printable) - {"\r", "\x0b", "\x0c"})
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>", *chars])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  clean_up_tokenization_spaces=False)  # fmt: skip
    # "```\n" makes the decoded whole tokenize differently from the sampled ids: a closing fence sampled before an
    # observation's first newline would merge with it
    tok.add_tokens([OPEN, CLOSE, CLOSE + "\n", *CODE.values(), *HERMES, NAP, "<|im_start|>", "<|im_end|>"])
    tok.chat_template = CHATML
    return tok


def bigram_model(tok, successor: dict[str, str | tuple[str, ...]]):
    """A Qwen2 whose next token depends on the current one only: `successor[token]` (a tuple: one of them, equally
    likely), else the end token."""
    vocab = len(tok)
    assert vocab <= 128, vocab  # one-hot embeddings: the width holds the vocabulary
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=128, intermediate_size=8, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
    model = Qwen2ForCausalLM(cfg)
    ids = {t: tok.convert_tokens_to_ids(t) for t in tok.get_vocab()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
        model.model.embed_tokens.weight[:, :vocab] = torch.eye(vocab)
        for token, i in ids.items():  # a token with no successor is followed by the end token
            after = successor.get(token)
            for nxt in after if isinstance(after, tuple) else (after,):
                model.lm_head.weight[ids.get(nxt, tok.eos_token_id), i] = 1.6  # p ~ 1 - 5e-6
    return model


def _engine(tok, successor, **overrides):
    values = dict(tools="python", max_completion_length=80, max_prompt_length=8, device="cpu", top_k=0)
    config = make_config("tiny", **{**values, **overrides})
    return HFEngine(bigram_model(tok, successor), tok, config), config


class TableSandbox:
    """A `fastrl.tools.Sandbox` that answers from a table (the local sandbox's own tests live in tests/tools)."""

    def __init__(self, table: dict[str, ToolResult]):
        self.table, self.calls = table, []

    def run(self, code, *, timeout_s=10.0, memory_mb=1024):
        self.calls.append((code, timeout_s, memory_mb))
        return self.table[code]


def chain(code: str, again: bool = False) -> dict[str, str]:
    """?: a call running `code`; after its observation (which ends with a newline) the end, or another call."""
    after = OPEN if again else "</s>"
    return {"?": OPEN, OPEN: code, code: CLOSE, CLOSE: "\n", "\n": after, CLOSE + "\n": after}


def test_trainer_ids_are_the_samplers_token_for_token_across_turns(monkeypatch):
    tok = markup_tokenizer()
    engine, config = _engine(tok, chain(CODE["six"], again=True), max_tool_calls=3)
    engine.tools.sandbox = TableSandbox({CODE["six"]: ToolResult("42\n", "ok")})
    rounds = []
    sample = engine._sample

    def recorded(requests, want_logprobs):
        out = sample(requests, want_logprobs)
        rounds.append([(list(ctx), list(new)) for (ctx, _, _), (new, _, _) in zip(requests, out)])
        return out

    monkeypatch.setattr(engine, "_sample", recorded)
    prompt = tok.encode("?", add_special_tokens=False)
    (comp,) = engine.generate([prompt], 1, want_logprobs=True)
    observation = tok.encode("\n```output\n42\n\n```\n", add_special_tokens=False)
    call = tok.encode(OPEN + CODE["six"] + CLOSE, add_special_tokens=False)
    # the engine stops each round at the token that closes a call: three rounds end at their calls, and rounds go on
    # past max_tool_calls (stopping at the calls the loop no longer runs) to the length cap
    assert len(call) == 3 and [new for ((_, new),) in rounds[:3]] == [call] * 3 and len(rounds) > 3
    assert comp.completion_ids[: 3 * len(call + observation)] == 3 * (call + observation)
    # each round continued exactly the ids the completion had: the sampled ones, then the observation's
    for r, ((ctx, new),) in enumerate(rounds):
        assert ctx == prompt + comp.completion_ids[: len(ctx) - len(prompt)], r
    turn = len(call + observation)
    spans = [InsertedSpan(k * turn + len(call), (k + 1) * turn, "tool") for k in range(3)]
    assert comp.inserted == tuple(spans)
    assert comp.truncated and len(comp.completion_ids) == config.max_completion_length
    assert comp.tool_calls == 3 and (comp.tool_errors, comp.tool_timeouts) == (0, 0)
    (s,) = scoring.to_samples([comp], [1.0], torch.zeros(1), config)  # what the trainer trains on
    assert s.prompt_ids == prompt and s.completion_ids == comp.completion_ids
    mask = scoring.sampled_mask(comp)
    assert [i for i, m in enumerate(mask) if m == 0] == [i for a, b, _ in spans for i in range(a, b)]
    assert all(lp == 0.0 for a, b, _ in spans for lp in comp.logprobs[a:b])
    sampled = [lp for i, lp in enumerate(comp.logprobs) if mask[i]]
    assert all(-1e-3 < lp < 0.0 for lp in sampled)  # the bigram machine's near-certain tokens keep their own


def test_max_tool_calls_zero_runs_nothing_and_the_completion_ends_at_its_end_token():
    tok = markup_tokenizer()
    engine, _ = _engine(tok, chain(CODE["six"]), max_tool_calls=0)
    engine.tools.sandbox = sandbox = TableSandbox({})
    (comp,) = engine.generate([tok.encode("?", add_special_tokens=False)], 1)
    assert tok.decode(comp.completion_ids) == OPEN + CODE["six"] + CLOSE + "\n</s>"
    assert not comp.truncated and comp.inserted == () and sandbox.calls == [] and comp.tool_calls == 0


def test_an_observation_past_the_length_cap_is_cut_there():
    tok = markup_tokenizer()
    engine, _ = _engine(tok, chain(CODE["six"]), max_completion_length=10)
    engine.tools.sandbox = TableSandbox({CODE["six"]: ToolResult("42\n", "ok")})
    (comp,) = engine.generate([tok.encode("?", add_special_tokens=False)], 1)
    assert len(comp.completion_ids) == 10 and comp.truncated
    assert comp.inserted == (InsertedSpan(3, 10, "tool"),)
    assert tok.decode(comp.completion_ids[3:]) == "\n```outpu"  # the first 7 of the observation


def test_errors_and_timeouts_are_observations_and_metrics():
    tok = markup_tokenizer()
    engine, _ = _engine(tok, chain(CODE["zero"]), tool_timeout_s=0.5, tool_memory_mb=256)
    sandbox = TableSandbox({CODE["zero"]: ToolResult("ZeroDivisionError: division by zero\n", "error")})
    engine.tools.sandbox = sandbox
    prompt = tok.encode("?", add_special_tokens=False)
    comps = engine.generate([prompt], 2)
    assert sandbox.calls == [(CODE["zero"], 0.5, 256)] * 2
    assert all("ZeroDivisionError" in tok.decode(c.completion_ids) and not c.truncated for c in comps)
    sandbox.table[CODE["zero"]] = ToolResult("", "timeout")
    (late,) = engine.generate([prompt], 1)
    assert tok.decode(late.completion_ids).endswith("```output\n\n[timed out after 0.5 s]\n```\n</s>")
    batch = [*comps, late]
    scores = scoring.Scores(torch.zeros(3, dtype=torch.float64), [0.0] * 3, {})
    config = make_config("tiny", tools="python", group_size=3)
    metrics = scoring.rollout_metrics(scoring.rollout_sums(batch, [1], scores, torch.zeros(1), config), 80)
    assert metrics["tool_calls_mean"] == 1.0 and metrics["tool_errors_frac"] == pytest.approx(2 / 3)
    assert metrics["tool_timeouts"] == 1 and metrics["tool_time_s"] >= 0.0
    assert isinstance(late, ToolCompletion) and tool_sums([Completion([1], [2], False)]) == {}


@pytest.mark.slow
def test_the_local_sandbox_runs_the_calls_errors_and_timeouts_included():
    tok = markup_tokenizer()
    for code, status, said in [("six", "ok", "42"), ("zero", "error", "ZeroDivisionError"),
                               ("loop", "timeout", "[timed out after 1 s]")]:  # fmt: skip
        engine, _ = _engine(tok, chain(CODE[code]), tool_timeout_s=1.0, max_completion_length=120)
        comps = engine.generate([tok.encode("?", add_special_tokens=False)], 2)
        for c in comps:
            assert said in tok.decode(c.completion_ids), (code, tok.decode(c.completion_ids))
            assert c.tool_calls == 1 and (c.tool_errors, c.tool_timeouts) == (status == "error", status == "timeout")


def test_a_user_tool_in_the_hermes_format_answers_through_the_chat_template():
    tok = markup_tokenizer()
    successor = {"?": HERMES[0], HERMES[0]: HERMES[1], HERMES[1]: HERMES[2], HERMES[2]: "<|im_end|>"}
    engine, _ = _engine(tok, successor, tools=f"{__name__}:word_count", tool_format="hermes", chat_template=True)
    assert engine.tools.tools == {"word_count": word_count}
    (comp,) = engine.generate([tok.encode("?", add_special_tokens=False)], 1)
    observation = (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.decode(comp.completion_ids) == "".join(HERMES) + observation + "</s>"
    assert comp.inserted == (InsertedSpan(3, 3 + len(tok.encode(observation, add_special_tokens=False)), "tool"),)
    assert comp.tool_calls == 1 and comp.tool_errors == 0 and not comp.truncated


def test_replay_keeps_the_sampled_tokens_sets_and_gives_observations_empty_ones():
    tok = markup_tokenizer()
    engine, _ = _engine(tok, chain(CODE["six"], again=True), max_tool_calls=2, top_p=0.9, sampler_replay="on")
    engine.tools.sandbox = TableSandbox({CODE["six"]: ToolResult("42\n", "ok")})
    (comp,) = engine.generate([tok.encode("?", add_special_tokens=False)], 1)
    assert engine.replay and comp.kept.counts.numel() == len(comp.completion_ids) == 80
    inserted = {i for a, b, _ in comp.inserted for i in range(a, b)}
    assert len(comp.inserted) == 2 and len(inserted) > 0
    # top-p 0.9 keeps the one likely id of each sampled token (the bigram machine's), none of an observation's
    assert comp.kept.counts.tolist() == [0 if i in inserted else 1 for i in range(80)]
    starts = [0, *comp.kept.counts.cumsum(0).tolist()]
    for i, token in enumerate(comp.completion_ids):  # each sampled token is in its own kept set
        assert i in inserted or token in comp.kept.ids[starts[i] : starts[i + 1]].tolist(), i


@pytest.mark.slow
def test_a_training_run_with_the_python_tool_logs_the_tool_metrics(tmp_path):
    """train() end to end on a model directory: the local sandbox runs each completion's call, the step trains on the
    sampled tokens only, and the step's row carries the tool metrics."""
    tok = markup_tokenizer()
    bigram_model(tok, chain(CODE["six"])).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "?", "answer": "42"}\n' * 4)
    config = make_config(model=str(tmp_path / "model"), dataset=str(data), rewards=("accuracy:1.0",), tools="python",
                         output_dir=str(tmp_path / "run"), max_steps=1, prompts_per_step=2, group_size=2,
                         max_completion_length=40, max_prompt_length=8, progress=False, device="cpu", lr=1e-4,
                         log_entropy=False, is_cap=2.0)  # fmt: skip
    train(config)
    (row,) = read_metrics(str(tmp_path / "run"))
    assert row["tool_calls_mean"] == 1.0 and row["tool_errors_frac"] == 0.0 and row["tool_timeouts"] == 0
    assert 0.0 < row["tool_time_s"] < 4 * config.tool_timeout_s


def test_a_user_tool_past_its_timeout_is_a_timeout_observation():
    tok = markup_tokenizer()
    successor = {"?": HERMES[0], HERMES[0]: NAP, NAP: HERMES[2], HERMES[2]: "<|im_end|>"}
    engine, _ = _engine(tok, successor, tools=f"{__name__}:nap", tool_format="hermes", chat_template=True,
                        tool_timeout_s=0.2)  # fmt: skip
    t0 = time.perf_counter()
    (comp,) = engine.generate([tok.encode("?", add_special_tokens=False)], 1)
    assert time.perf_counter() - t0 < 2.5  # the rollout did not wait out the tool's 3 s
    assert "<tool_response>\n\n[timed out after 0.2 s]\n</tool_response>" in tok.decode(comp.completion_ids)
    assert (comp.tool_calls, comp.tool_timeouts, comp.tool_errors) == (1, 1, 0)


def test_the_hermes_prompt_lists_the_tools_schemas():
    """In the hermes format the chat template is given the tools' JSON schemas, so the model is told what it may
    call (the built-in python's and a user tool's, from its signature and docstring); the code format lists none."""
    from fastrl.trainer.rollout import build_prompt
    from fastrl.trainer.stages import CollectSettings

    tok = markup_tokenizer()
    tok.chat_template = "{% for t in tools or [] %}{{ t | tojson }}\n{% endfor %}" + CHATML
    config = make_config(tools=f"python,{__name__}:word_count", tool_format="hermes", chat_template=True)
    settings = CollectSettings.from_config(config)
    assert [t["function"]["name"] for t in settings.tools] == ["python", "word_count"]
    assert settings.tools[1]["function"]["parameters"]["properties"]["text"]["type"] == "string"
    prompt = tok.decode(build_prompt(tok, "q", "{prompt}", True, 4096, settings.tools))
    assert '"name": "word_count"' in prompt and '"name": "python"' in prompt and prompt.endswith("assistant\n")
    assert CollectSettings.from_config(make_config(tools="python")).tools == ()


def scripted_rounds(tok, texts: list[str], contexts: list):
    """A `sample_round` whose k-th round gives every request the ids of `texts[k]` (an engine that samples on past
    a call, as vLLM does); records each round's contexts."""

    def sample_round(requests):
        contexts.append([list(ctx) for ctx, _, _ in requests])
        new = tok.encode(texts[len(contexts) - 1], add_special_tokens=False)
        return [(new, [-0.5] * len(new), None) for _ in requests]

    return sample_round


def chat_prompt(tok, question: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


def test_hermes_calls_are_what_parse_response_reads_after_the_prompt():
    """A chat template that opens `<think>` in its generation prompt: the call the model only mentions while
    thinking is not run (parse_response, given the prompt as prefix, reads it as reasoning); the call after
    `</think>` is, and it is the call parse_response reads on the same text; what was sampled past it (another
    call, the end) is dropped."""
    tok = markup_tokenizer()
    tok.chat_template = CHATML.replace(GENERATION, GENERATION.replace(CHATML_START, CHATML_START + "<think>\n"))
    config = make_config("tiny", tools=f"{__name__}:word_count", tool_format="hermes", chat_template=True)
    turns = tool_turns_of(config, tok)
    ran, run = [], turns.run
    turns.run = lambda call: (ran.append(call), run(call))[1]
    prompt = chat_prompt(tok, "count")
    mention = 'I could <tool_call>{"name": "nap", "arguments": {}}</tool_call>, no.</think>\n'
    call = '<tool_call>\n{"name": "word_count", "arguments": {"text": "a b c"}}\n</tool_call>'
    past, after = "\n<tool_call>" + NAP + "</tool_call><|im_end|></s>", "3 words.</think>\nThree.<|im_end|></s>"
    contexts = []
    rounds = scripted_rounds(tok, [mention + call + past, after], contexts)
    (comp,) = sample_with_tools([prompt], 1, turns, 600, 0, {tok.eos_token_id}, rounds)
    parsed = tok.parse_response(mention + call, HERMES_RESPONSE_TEMPLATE, prefix=tok.decode(prompt), tools=[word_count])
    assert [c["function"] for c in parsed["tool_calls"]] == [{"name": "word_count", "arguments": {"text": "a b c"}}]
    assert ran == [ToolCall("word_count", {"text": "a b c"})]
    sampled = tok.encode(mention + call, add_special_tokens=False)
    (span,) = comp.inserted
    assert comp.completion_ids[: span.start] == sampled and span.start == len(sampled)
    observation = tok.decode(comp.completion_ids[span.start : span.end])
    assert observation == "<|im_end|>\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n" \
        "<|im_start|>assistant\n<think>\n"  # fmt: skip
    assert contexts[1][0] == prompt + comp.completion_ids[: span.end] and comp.tool_calls == 1
    assert tok.decode(comp.completion_ids[span.end :]) == after


def test_a_malformed_hermes_call_is_an_observation():
    tok = markup_tokenizer()
    config = make_config("tiny", tools=f"{__name__}:word_count", tool_format="hermes", chat_template=True)
    turns = tool_turns_of(config, tok)
    prompt = chat_prompt(tok, "count")
    rounds = scripted_rounds(tok, ["<tool_call>{name: word_count}</tool_call>", "Sorry.<|im_end|></s>"], [])
    (comp,) = sample_with_tools([prompt], 1, turns, 600, 0, {tok.eos_token_id}, rounds)
    (span,) = comp.inserted
    assert "the tool call is not valid JSON" in tok.decode(comp.completion_ids[span.start : span.end])
    assert (comp.tool_calls, comp.tool_errors) == (1, 1) and not comp.truncated


def test_hermes_needs_chatml_turns():
    tok = markup_tokenizer()  # a template whose turns are not ChatML: the parser would read the prompt as the reply
    tok.chat_template = "{% for m in messages %}{{ m.content }}\n{% endfor %}" + GENERATION.replace(CHATML_START, "A: ")
    config = make_config("tiny", tools=f"{__name__}:word_count", tool_format="hermes", chat_template=True)
    with pytest.raises(ValueError, match=r"reads ChatML assistant turns .*generation prompt ends '\?\\nA: '"):
        tool_turns_of(config, tok)


def said_42(completion: str, gold: str) -> float:
    """1 when the model wrote 42 itself (the reward text holds no tool output)."""
    return float("42" in completion)


# the reference run's old and reference log-probs of every tool token move up by POISON, rollout's down: a tool
# token's IS log ratio (the model's log-prob against the sampler's placeholder 0.0, mostly near -18) moves by +40
POISON = 20.0
COMPARED = ("loss", "kl_mean", "ratio_mean", "clip_frac_low", "clip_frac_high", "entropy_mean", "grad_norm",
            "train_tokens", "reward_mean", "response_length_mean", "inserted_tokens")  # fmt: skip


def poison_tool_logprobs(samples) -> None:
    """Move the old, reference and rollout log-probs at the samples' tool tokens (token mask 0) by POISON."""
    for s in samples:
        tool = [m == 0 for m in s.token_mask]
        for field, by in (("old_logprobs", POISON), ("ref_logprobs", POISON), ("rollout_logprobs", -POISON)):
            setattr(s, field, [x + by * t for x, t in zip(getattr(s, field), tool)])


@pytest.mark.slow
def test_tools_with_steps_checkpointing_packing_beta_and_is_cap(tmp_path, monkeypatch):
    """One tools run (the sandboxed python, a fixed seed) with two optimizer steps per rollout batch, gradient
    checkpointing, packing, beta > 0 and a sequence-level is_cap, against a reference on the same completions:
    neither checkpointing nor packing, and the old, reference and rollout log-probs of every tool token poisoned.
    Every step's loss, KL, ratio, clip fractions, entropy, gradient norm and token counts are equal: checkpointing
    and packing are exact, and no term of several optimizer steps sees a tool token (sequence IS sums included)."""
    tok = markup_tokenizer()
    # after its call's observation the model answers 42 or ends, one or the other: the group's rewards differ
    successor = {**chain(CODE["six"]), CLOSE + "\n": ("4", "</s>"), "4": "2", "2": "</s>"}
    bigram_model(tok, successor).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "?", "answer": "42"}\n' * 8)

    def run(name: str, **options) -> list[dict]:
        config = make_config(model=str(tmp_path / "model"), dataset=str(data), tools="python", seed=3,
                             output_dir=str(tmp_path / name), max_steps=4, prompts_per_step=2, group_size=4,
                             minibatches=2, beta=0.05, is_cap=2.0, is_level="sequence", max_completion_length=24,
                             max_prompt_length=8, progress=False, device="cpu", lr=1e-3, **options)  # fmt: skip
        train(config, rewards=[(said_42, 1.0)])
        return read_metrics(str(tmp_path / name))

    rows = run("all", gradient_checkpointing=True, packing="on")
    attach = sources.attach_logprobs

    def poisoned(run_, samples, old):  # the reference's log-probs, poisoned at tool tokens once attached
        attach(run_, samples, old)
        poison_tool_logprobs(samples)

    monkeypatch.setattr(sources, "attach_logprobs", poisoned)
    reference = run("reference", gradient_checkpointing=False, packing="off")
    assert len(rows) == len(reference) == 4 and all(r["tool_calls_mean"] == 1.0 for r in rows)
    assert all(0.0 < r["reward_mean"] < 1.0 and r["update_skipped"] == 0.0 for r in rows), rows
    assert rows[-1]["kl_mean"] > 1e-6, rows[-1]
    for step, (got, want) in enumerate(zip(rows, reference)):
        for key in COMPARED:
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), (key, step)
