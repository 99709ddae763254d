"""The vLLM rollout engine against the transformers model it serves (vLLM's CPU build, float32)."""

import copy
import dataclasses
import random

import numpy
import pytest
import torch
from vllm_reference import TOL, max_gap, tiny_config

from fastrl.trainer.build import build_model
from fastrl.trainer.rollout import make_engine


@pytest.fixture(scope="module")
def served():
    """(config, model, tokenizer, engine): the tiny pair and a vLLM engine synced to it."""
    config = tiny_config()
    torch.manual_seed(0)
    model, tokenizer = build_model(config, torch.device("cpu"))
    model.eval()
    torch.manual_seed(123)
    random.seed(123)
    numpy.random.seed(123)
    states = torch.get_rng_state(), random.getstate(), numpy.random.get_state()[1].copy(), torch.get_num_threads()
    engine = make_engine("vllm", model, tokenizer, config)
    # starting vLLM (which seeds every global RNG) leaves the trainer's RNGs and thread count alone
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
    assert (numpy.random.get_state()[1] == states[2]).all() and torch.get_num_threads() == states[3]
    engine.sync_weights(model)
    return config, model, tokenizer, engine


def prompts_of(tokenizer, n_long: int = 1) -> list[list[int]]:
    """Three short task prompts and `n_long` random 301-token ones."""
    short = [tokenizer.encode(q, add_special_tokens=True) for q in ("3+4=", "9+9=", "1+8=")]
    g = torch.Generator().manual_seed(len(tokenizer) + n_long)
    body = [torch.randint(6, len(tokenizer), (300,), generator=g).tolist() for _ in range(n_long)]
    return short + [[tokenizer.bos_token_id] + b for b in body]


def test_generate_n_samples_with_logprobs_of_the_sampling_distribution(served):
    config, model, tokenizer, engine = served
    prompts, n, eos = prompts_of(tokenizer), 4, tokenizer.eos_token_id
    comps = engine.generate(prompts, n, want_logprobs=True)
    assert len(comps) == len(prompts) * n
    for i, c in enumerate(comps):
        assert c.prompt_ids == prompts[i // n]  # grouped: completions [i*n : (i+1)*n] belong to prompts[i]
        assert 1 <= len(c.completion_ids) <= config.max_completion_length
        assert eos not in c.completion_ids[:-1]
        assert c.truncated == (c.completion_ids[-1] != eos)
        assert not c.truncated or len(c.completion_ids) == config.max_completion_length
        assert len(c.logprobs) == len(c.completion_ids) and max(c.logprobs) <= 0
    assert all(len({tuple(c.completion_ids) for c in comps[i : i + n]}) > 1 for i in range(0, len(comps), n))
    assert max_gap(model, comps) < TOL
    # vLLM's default would be the raw model's log-probs, i.e. at temperature 1
    assert max_gap(model, comps, temperature=1.0) > 0.05
    assert all(c.logprobs is None for c in engine.generate(prompts[:1], 2))
    assert engine.generate([], n) == []


def test_logprobs_follow_top_p(served):
    config, model, tokenizer, engine = served
    sampler = engine.sampler
    engine.sampler = dataclasses.replace(sampler, top_p=0.8)
    try:
        comps = engine.generate(prompts_of(tokenizer), 4, want_logprobs=True)
    finally:
        engine.sampler = sampler
    assert max_gap(model, comps, top_p=0.8) < TOL
    assert max_gap(model, comps) > 0.05  # the renormalised nucleus, not the full distribution


def test_sync_after_optimizer_steps_serves_the_new_weights(served):
    """After AdamW steps and a sync, vLLM samples from the new weights, prefix-cached long prompts included."""
    config, model, tokenizer, engine = served
    prompts = prompts_of(tokenizer, n_long=2)
    before = engine.generate(prompts, 2, want_logprobs=True)  # also puts the prompts in vLLM's prefix cache
    assert max_gap(model, before) < TOL
    old = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for c in before[:3]:
        ids = torch.tensor([c.prompt_ids + c.completion_ids])
        opt.zero_grad()
        model(ids, labels=ids).loss.backward()
        opt.step()
    model.eval()
    engine.sync_weights(model)
    after = engine.generate(prompts, 2, want_logprobs=True)
    long = [c for c in after if len(c.prompt_ids) > 300]
    assert len(long) == 4
    assert max_gap(model, after) < TOL and max_gap(model, long) < TOL
    assert max_gap(old, after) > 0.5 and max_gap(old, long) > 0.5


def test_dtype_comes_from_the_config():
    config = tiny_config(vllm_dtype="bfloat16")
    model, tokenizer = build_model(config, torch.device("cpu"))
    engine = make_engine("vllm", model, tokenizer, config)
    assert engine.llm.llm_engine.model_config.dtype == torch.bfloat16
    engine.sync_weights(model)
    comps = engine.generate(prompts_of(tokenizer), 2, want_logprobs=True)
    assert max_gap(model, comps) < 0.1  # bfloat16 weights and activations against the float32 model
