"""The thinking budget on the vLLM engine (the tiny model, a forced budget): the exact insertion, the log-probs of
what the model samples after it, and the loss mask of the inserted tokens."""

import pytest
import torch
from transformers import TemperatureLogitsWarper
from vllm_reference import TOL, T, tiny_config

from fastrl.trainer.batching import collate
from fastrl.trainer.build import build_model
from fastrl.trainer.rollout import make_engine
from fastrl.trainer.rollout.interface import end_token_ids
from fastrl.trainer.scoring import to_samples
from fastrl.trainer.update import StepSettings, sequence_logprobs

N, M, STOP = 5, 30, " stop."


def _span(c) -> tuple[int, int] | None:
    """A completion's one thinking span as (start, end), None when nothing was inserted."""
    assert len(c.inserted) <= 1 and all(s.kind == "thinking" for s in c.inserted), c.inserted
    return tuple(c.inserted[0][:2]) if c.inserted else None


@pytest.fixture(scope="module")
def rollouts():
    """Two completions of each prompt, every one forced to M tokens; the first two prompts open the span."""
    settings = dict(thinking_budget=N, max_completion_length=M, min_completion_length=M, thinking_stop_text=STOP,
                    group_size=2, is_cap=2.0)  # fmt: skip
    torch.manual_seed(0)
    model, tokenizer = build_model(tiny_config(**settings), torch.device("cpu"))
    model.eval()
    # top-k V - #end tokens: keeps every token but the end tokens min_completion_length suppresses (the distribution
    # the tests below expect), yet it truncates, so the engine records each round's kept sets for replay
    config = tiny_config(**settings, top_k=model.config.vocab_size - len(end_token_ids(model, tokenizer)))
    engine = make_engine("vllm", model, tokenizer, config)
    engine.sync_weights(model)
    # the engine serves a longest prompt plus a longest completion (inserted tokens are part of it)
    assert engine.llm.llm_engine.model_config.max_model_len == config.max_prompt_length + M
    prompts = [tokenizer.encode(q, add_special_tokens=True) for q in ("3+4=<think>", "12+9=<think>", "1+1=")]
    return config, model, tokenizer, engine.generate(prompts, 2, want_logprobs=True)


def sampled(c) -> torch.Tensor:
    return torch.tensor([not (_span(c) and _span(c)[0] <= i < _span(c)[1]) for i in range(len(c.completion_ids))])


@torch.no_grad()
def test_vllm_inserts_at_the_budget_and_samples_the_answer_after_it(rollouts):
    config, model, tokenizer, comps = rollouts
    insert = tokenizer.encode(STOP + "</think>")
    for c in comps[:4]:
        assert len(c.completion_ids) == M and c.truncated
        assert _span(c) == (N, N + len(insert)) and c.completion_ids[N : N + len(insert)] == insert
    for c in comps[4:]:  # no span in the prompt: nothing inserted unless the model opened one itself
        assert len(c.completion_ids) == M
        assert _span(c) is None or c.completion_ids[_span(c)[0] - N - 1] == tokenizer.encode("<think>")[0]
    # vLLM's log-probs of the tokens it sampled (after the inserted ones too) are the policy's given everything
    # before them, inserted tokens included, with the end token suppressed below min_completion_length
    for c in comps:
        ids = torch.tensor([c.prompt_ids + c.completion_ids])
        logits = model(ids).logits[0, len(c.prompt_ids) - 1 : -1].float()
        logits[:, tokenizer.eos_token_id] = -float("inf")
        ref = TemperatureLogitsWarper(T)(ids, logits).log_softmax(-1)
        ref = ref.gather(-1, torch.tensor(c.completion_ids)[:, None])[:, 0]
        got, keep = torch.tensor(c.logprobs), sampled(c)
        assert float((got[keep] - ref[keep]).abs().max()) < TOL
        assert (got[~keep] == 0).all()


def test_inserted_tokens_are_masked_out_of_the_loss(rollouts):
    config, _, tokenizer, comps = rollouts
    samples = to_samples(comps, [1.0, -1.0] * 3, torch.zeros(3, dtype=torch.bool), config)
    mask = collate(samples, packed=True, pad_id=tokenizer.pad_token_id)["mask"]
    L = len(tokenizer.encode(STOP + "</think>"))
    for row, c in enumerate(comps):
        lo, hi = _span(c) or (M, M)
        expected = [1.0] * lo + [0.0] * (hi - lo) + [1.0] * (M - hi)
        assert samples[row].token_mask == (None if _span(c) is None else expected)
        assert mask[row].tolist() == expected
    assert sum(mask.sum(1).tolist()) == 6 * M - L * sum(_span(c) is not None for c in comps)


def test_the_rounds_kept_sets_are_concatenated_and_replayed(rollouts):
    config, model, tokenizer, comps = rollouts
    for c in comps:  # every token but the suppressed end tokens; inserted tokens none
        assert c.kept.counts.tolist() == [config.top_k if k else 0 for k in sampled(c).tolist()]
    samples = to_samples(comps, [1.0, -1.0] * 3, torch.zeros(3, dtype=torch.bool), config)
    settings = StepSettings(config.loss, 1 << 20, False, tokenizer.pad_token_id, impl="torch", bf16=False)
    for c, row in zip(comps, sequence_logprobs(model, samples, settings)):
        keep = sampled(c)
        assert float((torch.tensor(row)[keep] - torch.tensor(c.logprobs)[keep]).abs().max()) <= 1e-5
