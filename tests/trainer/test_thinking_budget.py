"""The thinking budget: where the span starts and runs out, the round-based sampling, and the HF engine on the
tiny model with a forced budget (exact positions of the insertion, of the loss mask and of the rollout log-probs)."""

import pytest
import torch
from transformers import TemperatureLogitsWarper

from fastrl.trainer.batching import KeptSets, collate
from fastrl.trainer.build import build_model
from fastrl.trainer.config import ConfigError, make_config
from fastrl.trainer.rollout import InsertedSpan, ThinkingBudget, budget_cut, make_engine, thinking_budget_of
from fastrl.trainer.rollout.thinking import sample_with_budget, span_start
from fastrl.trainer.scoring import rollout_metrics, rollout_sums, to_samples
from fastrl.trainer.update import StepSettings, train_step

# two-token markers, so a marker split over the budget's edge is seen
TB = ThinkingBudget(budget=4, start_ids=(90, 91), end_ids=(92, 93), insert_ids=(80, 81, 92, 93))
EOS = 2


def _span(c) -> tuple[int, int] | None:
    """A completion's one thinking span as (start, end), None when nothing was inserted."""
    assert len(c.inserted) <= 1 and all(s.kind == "thinking" for s in c.inserted), c.inserted
    return tuple(c.inserted[0][:2]) if c.inserted else None


@pytest.mark.parametrize(
    "prompt, completion, start, cut",
    [
        ([1, 90, 91], [5, 6, 7, 8, 9], 0, 4),  # opened by the prompt: the budget's 4 tokens, then the cut
        ([1, 90, 91], [5, 6, 7], 0, None),  # not yet at the budget
        ([1, 90, 91], [5, 92, 93, 8, 9], 0, None),  # closed within it
        ([1, 90, 91], [5, 6, 92, 93, 9], 0, None),  # closed by its last two tokens
        ([1, 90, 91], [5, 6, 7, 92, 93], 0, 4),  # the closing marker straddles the budget's edge: not closed
        ([1, 90, 91, 5, 92, 93], [5, 6, 7, 8, 9], None, None),  # opened and closed in the prompt
        ([1, 4], [5, 90, 91, 6, 7, 8, 9, 10], 3, 7),  # opened by the completion at 1: tokens from 3
        ([1, 4], [5, 6, 7, 8, 9, 10], None, None),  # never opened
        ([1, 90, 91, 92, 93, 90, 91], [5, 6, 7, 8], 0, 4),  # the prompt's last opening is open
    ],
    ids=["prompt-open", "short", "closed", "closed-at-edge", "straddles", "prompt-closed", "opened-later",
         "never", "reopened"],
)  # fmt: skip
def test_span_start_and_budget_cut(prompt, completion, start, cut):
    assert span_start(prompt, completion, TB) == start
    assert budget_cut(prompt, completion, TB) == cut


def scripted(tokens_by_prompt: dict):
    """A sampler that continues each context with its script's next tokens; records every request."""
    calls = []

    def sample_round(requests):
        calls.append([(len(ctx), limit, min_new) for ctx, limit, min_new in requests])
        out = []
        for ctx, limit, _ in requests:
            script = tokens_by_prompt[ctx[0]]
            done = len(ctx) - 3  # every scripted prompt has 3 tokens
            new = []
            for t in script[done : done + limit]:
                new.append(t)
                if t == EOS:
                    break
            out.append((new, [-1.0] * len(new), KeptSets.of([[t, 200 + t] for t in new])))
        return out

    return sample_round, calls


def test_rounds_insert_at_the_budget_and_continue_from_the_inserted_tokens():
    scripts = {
        10: [5, 6, 7, 8, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9],  # opened in the prompt, never closes
        11: [5, 90, 91, 6, 7, 8, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9],  # opens itself, runs past the budget
        12: [5, 6, 7, EOS],  # ends as its last budgeted token
        13: [5, 92, 93, 8, 9, EOS],  # closes, then answers
    }
    sample_round, calls = scripted(scripts)
    prompts = [[10, 90, 91], [11, 4, 4], [12, 90, 91], [13, 90, 91]]
    comps = sample_with_budget(prompts, 1, TB, 12, 0, {EOS}, sample_round, want_logprobs=True)
    a, b, c, d = comps
    # sampled 4, inserted [4, 8), then the continuation of the context that holds the inserted tokens
    assert a.completion_ids == [5, 6, 7, 8, 80, 81, 92, 93, 9, 9, 9, 9] and a.truncated
    assert a.inserted == (InsertedSpan(4, 8, "thinking"),)
    assert a.logprobs == [-1.0] * 4 + [0.0] * 4 + [-1.0] * 4
    for comp in comps:  # the rounds' kept sets, concatenated and cut with their tokens; inserted ones empty
        sampled = [t for i, t in enumerate(comp.completion_ids) if _span(comp) is None or not
                   _span(comp)[0] <= i < _span(comp)[1]]  # fmt: skip
        assert comp.kept.counts.tolist() == [
            0 if _span(comp) and _span(comp)[0] <= i < _span(comp)[1] else 2 for i in range(len(comp.completion_ids))
        ]
        assert comp.kept.ids.tolist() == [x for t in sampled for x in (t, 200 + t)]
    # opened at 1, thinking tokens from 3, cut back to 3 + 4 = 7 (the tokens sampled after it are dropped)
    assert b.completion_ids == [5, 90, 91, 6, 7, 8, 9, 80, 81, 92, 93, 9] and _span(b) == (7, 11)
    assert c.completion_ids == [5, 6, 7, EOS] and _span(c) is None and not c.truncated
    assert d.completion_ids == [5, 92, 93, 8, 9, EOS] and _span(d) is None and not d.truncated
    # round 1 stops the prompt-opened spans at the budget; round 2 continues only a and b
    assert calls[0] == [(3, 4, 0), (3, 12, 0), (3, 4, 0), (3, 4, 0)]
    assert calls[1] == [(11, 4, 0), (14, 1, 0), (7, 8, 0)]  # d closed within its budget: no insertion
    assert len(calls) == 2


def test_insertion_cut_by_max_completion_length_is_truncated():
    sample_round, _ = scripted({11: [5, 6, 7, 90, 91, 6, 7, 8, 9, 9, 9]})
    (c,) = sample_with_budget([[11, 4, 4]], 1, TB, 10, 0, {EOS}, sample_round, want_logprobs=False)
    assert c.completion_ids == [5, 6, 7, 90, 91, 6, 7, 8, 9, 80] and _span(c) == (9, 10) and c.truncated
    assert c.logprobs is None


def test_config_checks():
    with pytest.raises(ConfigError, match="thinking_budget"):
        make_config("tiny", thinking_budget=12)  # the tiny preset's max_completion_length
    with pytest.raises(ConfigError, match="think_end"):
        make_config("tiny", thinking_budget=3, think_end="")
    with pytest.raises(ConfigError, match="min_completion_length"):
        make_config("tiny", min_completion_length=13)
    config = make_config("tiny", thinking_budget=3, max_completion_length=100)
    model, tokenizer = build_model(config, torch.device("cpu"))
    with pytest.raises(ConfigError, match="inserted tokens"):  # the default sentence is ~110 characters
        thinking_budget_of(config, tokenizer)


N, M, STOP = 5, 30, " stop."


@pytest.fixture(scope="module")
def forced():
    """The tiny model on the HF engine, every completion forced to M tokens, its thinking span opened by the prompt."""
    config = make_config("tiny", thinking_budget=N, max_completion_length=M, min_completion_length=M,
                         thinking_stop_text=STOP, temperature=0.7, is_cap=2.0, group_size=2)  # fmt: skip
    torch.manual_seed(0)
    model, tokenizer = build_model(config, torch.device("cpu"))
    engine = make_engine("hf", model, tokenizer, config)
    prompts = [tokenizer.encode(q, add_special_tokens=True) for q in ("3+4=<think>", "12+9=<think>", "1+1=")]
    torch.manual_seed(1)
    comps = engine.generate(prompts, 2, want_logprobs=True)
    return config, model, tokenizer, comps


def test_hf_engine_inserts_at_the_budget_and_the_model_continues_after_it(forced):
    config, model, tokenizer, comps = forced
    insert = tokenizer.encode(STOP + "</think>")
    for c in comps[:4]:  # the prompt opened the span: N sampled tokens, then the inserted ones
        assert len(c.completion_ids) == M and c.truncated
        assert _span(c) == (N, N + len(insert))
        assert c.completion_ids[N : N + len(insert)] == insert
        assert tokenizer.decode(c.completion_ids).startswith(tokenizer.decode(c.completion_ids[:N]) + " stop.</think>")
    for c in comps[4:]:  # no span: nothing inserted, unless the model opened one itself
        assert _span(c) is None or c.completion_ids[_span(c)[0] - N - 1] == tokenizer.encode("<think>")[0]
    # the log-probs of the tokens it sampled, after the inserted ones too, are the policy's given everything
    # before them (inserted tokens included), with end tokens suppressed (min_completion_length)
    eos = tokenizer.eos_token_id
    model.eval()
    for c in comps:
        ids = torch.tensor([c.prompt_ids + c.completion_ids])
        logits = model(ids).logits[0, len(c.prompt_ids) - 1 : -1].float()
        logits[:, eos] = -float("inf")
        ref = TemperatureLogitsWarper(0.7)(ids, logits).log_softmax(-1)
        ref = ref.gather(-1, torch.tensor(c.completion_ids)[:, None])[:, 0]
        sampled = torch.tensor([not (_span(c) and _span(c)[0] <= i < _span(c)[1]) for i in range(M)])
        got = torch.tensor(c.logprobs)
        torch.testing.assert_close(got[sampled], ref[sampled], rtol=0, atol=1e-5)
        assert (got[~sampled] == 0).all()


def test_inserted_tokens_leave_the_loss_mask_and_are_counted(forced):
    config, model, tokenizer, comps = forced
    samples = to_samples(comps, [1.0, -1.0] * 3, torch.zeros(3, dtype=torch.bool), config)
    L = len(tokenizer.encode(STOP + "</think>"))
    for s, c in zip(samples, comps):
        lo, hi = _span(c) or (M, M)
        assert s.token_mask == (None if _span(c) is None else [1.0] * lo + [0.0] * (hi - lo) + [1.0] * (M - hi))
    mask = collate(samples, packed=True, pad_id=0)["mask"]
    for row, c in enumerate(comps):
        lo, hi = _span(c) or (M, M)
        assert mask[row].tolist() == [1.0] * lo + [0.0] * (hi - lo) + [1.0] * (M - hi)
    sums = rollout_sums(comps, [len(c.prompt_ids) for c in comps[::2]], _scores(comps), torch.zeros(3), config)
    cut = [c for c in comps if _span(c)]
    metrics = rollout_metrics(sums, M)
    assert metrics["thinking_budget_cut_frac"] == len(cut) / 6 and len(cut) >= 4
    assert metrics["thinking_budget_inserted_tokens"] == L * len(cut)
    # the update counts (and normalizes by) the sampled tokens only; the rollout log-probs' zeros are masked
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    out = train_step(model, opt, samples, StepSettings(config.loss, 4096, True, 0, log_entropy=False))
    assert out["num_tokens"] == 6 * M - L * len(cut)


def _scores(comps):
    from fastrl.trainer.scoring import Scores

    n = len(comps)
    return Scores(torch.zeros(n, dtype=torch.float64), [0.0] * n, {})


def test_min_completion_length_forces_the_length_without_a_budget():
    config = make_config("tiny", max_completion_length=20, min_completion_length=20)
    torch.manual_seed(0)
    model, tokenizer = build_model(config, torch.device("cpu"))
    comps = make_engine("hf", model, tokenizer, config).generate([tokenizer.encode("1+1=", add_special_tokens=True)], 4)
    assert [len(c.completion_ids) for c in comps] == [20] * 4 and all(c.truncated for c in comps)
    assert all(tokenizer.eos_token_id not in c.completion_ids for c in comps)


def test_vllm_kv_cache_holds_one_longest_sequence():
    from fastrl.trainer.rollout.vllm_engine import kv_bytes_per_token, kv_cache_bytes

    config = make_config("tiny", max_completion_length=32768, vllm_kv_cache_gib=0.01)
    model, _ = build_model(config, torch.device("cpu"))
    assert model.config.max_position_embeddings == 512 + 32768  # vLLM serves the whole length
    assert kv_bytes_per_token(model, "float32") == 2 * 2 * 128 * 4  # K and V, 2 layers, width 128, float32
    with pytest.raises(ConfigError, match="vllm_kv_cache_gib"):
        kv_cache_bytes(config, model, "float32", 512 + 32768)  # 0.01 GiB: 5,242 tokens
    ok = make_config("tiny", max_completion_length=32768)  # the preset's 0.25 GiB: 131,072 tokens
    assert kv_cache_bytes(ok, model, "float32", 512 + 32768) == 2**28
