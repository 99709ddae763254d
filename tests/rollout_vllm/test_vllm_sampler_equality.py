"""fastrl's truncated log-probs (docs/math.md §8) against vLLM's own sampler functions on the same logits:
vLLM's min-p processor, then `apply_top_k_top_p`, then log_softmax (its "processed_logprobs"), against
`fastrl.token_logprobs` from the hidden states, float32. The kept sets must be equal and the log-probs agree to
float32 rounding; and the trainer scores a vLLM rollout at top-p / top-k as vLLM does."""

from types import SimpleNamespace

import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
from vllm.v1.sample.logits_processor.interface import BatchUpdate
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

import fastrl

N, D, V, T = 96, 64, 1003, 0.7


def vllm_processed_logprobs(logits, top_k, top_p, min_p):
    """vLLM's sampler on `[N, V]` float32 logits already divided by the temperature (its order)."""
    n = logits.shape[0]
    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=n))
    min_p_proc = MinPLogitsProcessor(config, torch.device("cpu"), False)
    added = [(i, SamplingParams(min_p=float(min_p[i])), None, []) for i in range(n)]
    min_p_proc.update_state(BatchUpdate(batch_size=n, removed=[], added=added, moved=[]))
    x = min_p_proc.apply(logits.clone())
    k = torch.where(top_k > 0, top_k, V)  # vLLM's per-request "off" is the full vocabulary
    x = apply_top_k_top_p(x, k, top_p)
    return x.log_softmax(-1)


@pytest.mark.parametrize("mode", ["min_p", "top_k", "top_p", "mixed"])
def test_kept_sets_and_logprobs_equal_vllms(mode):
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(N, D, generator=g)
    weight = torch.randn(V, D, generator=g) * (2.5 / D**0.5)
    targets = torch.randint(0, V, (N,), generator=g)
    off_k, off_p, off_m = torch.zeros(N, dtype=torch.long), torch.ones(N), torch.zeros(N)
    rows = torch.arange(N)
    top_k = torch.where(rows % 4 == 1, 1 + rows * 7 % 97, off_k) if mode in ("top_k", "mixed") else off_k
    top_p = torch.where(rows % 3 != 0, 0.5 + 0.45 * torch.rand(N, generator=g), off_p) if mode in (
        "top_p", "mixed") else off_p  # fmt: skip
    min_p = torch.where(rows % 5 != 2, 0.2 * torch.rand(N, generator=g), off_m) if mode in (
        "min_p", "mixed") else off_m  # fmt: skip
    if mode == "top_k":
        top_k = 1 + rows * 7 % 97
    logits = (hidden @ weight.T) / T
    # no two tokens tie at a kept set's boundary (vLLM would keep one of them by sort order, fastrl both)
    ranked = logits.sort(1, descending=True).values
    ref = vllm_processed_logprobs(logits, top_k, top_p, min_p)
    opts = dict(top_k=top_k, top_p=top_p, min_p=min_p)
    logp, ids, lps = fastrl.token_logprobs(hidden, weight, targets, temperature=T, return_topk=V, **opts)
    ours = torch.full((N, V), float("-inf")).scatter_(1, ids, lps)  # every token's log-prob, by id
    kept, vllm_kept = ours.isfinite(), ref.isfinite()
    assert (vllm_kept.sum(1) < V).sum() >= N // 3  # the case truncates
    size = vllm_kept.sum(1)
    last, first_out = ranked.gather(1, (size - 1)[:, None]), ranked.gather(1, size.clamp(max=V - 1)[:, None])
    assert ((last > first_out) | (size == V)[:, None]).all()
    assert torch.equal(kept, vllm_kept)
    torch.testing.assert_close(ours[kept], ref[kept], rtol=5e-7, atol=2e-6)  # a few float32 ulps of |logp|
    inside = vllm_kept.gather(1, targets[:, None])[:, 0]
    target_ref = ref.gather(1, targets[:, None])[:, 0]
    torch.testing.assert_close(logp[inside], target_ref[inside], rtol=5e-7, atol=2e-6)


def test_trainer_scores_a_vllm_rollout_as_vllm_does():
    """θ-recompute within TOL; the sets vLLM kept (our recorder: its CPU build), replayed, within 1e-5 per token; the
    same sets one position off (a planted misalignment) are far from it."""
    from vllm_reference import TOL, tiny_config

    from fastrl.trainer.batching import KeptSets, Sample
    from fastrl.trainer.build import build_model
    from fastrl.trainer.rollout import make_engine
    from fastrl.trainer.update import StepSettings, sampler_options, sequence_logprobs

    config = tiny_config(top_p=0.9, top_k=50, min_p=0.02, bf16=False)
    torch.manual_seed(0)
    model, tokenizer = build_model(config, torch.device("cpu"))
    model.eval()
    engine = make_engine("vllm", model, tokenizer, config)
    assert engine.replay  # sampler_replay="auto": the CPU build records the sets
    engine.sync_weights(model)
    prompts = [tokenizer.encode(q, add_special_tokens=True) for q in ("3+4=", "9+9=", "1+8=")]
    comps = engine.generate(prompts, 4, want_logprobs=True)
    samples = [Sample(c.prompt_ids, c.completion_ids, 0.0) for c in comps]
    vllm = torch.tensor([x for c in comps for x in c.logprobs])

    def gap(sampler, samples=samples):
        loss = fastrl.LossConfig(temperature=config.temperature, **(sampler or {}))
        settings = StepSettings(loss, 1 << 20, False, tokenizer.pad_token_id, impl="torch", bf16=False)
        lp = sequence_logprobs(model, samples, settings)
        return (torch.tensor([x for row in lp for x in row]) - vllm).abs()

    assert gap(sampler_options(config.loss)).max() < TOL
    assert gap(None).mean() > 0.05  # the full softmax is another distribution
    sizes = torch.cat([c.kept.counts for c in comps])
    assert sizes.numel() == vllm.numel() and (sizes >= 1).all() and (sizes < len(tokenizer)).float().mean() > 0.5
    replayed = [Sample(c.prompt_ids, c.completion_ids, 0.0, kept=c.kept) for c in comps]
    settings = StepSettings(config.loss, 1 << 20, False, tokenizer.pad_token_id, impl="torch", bf16=False)
    lp = sequence_logprobs(model, replayed, settings)
    assert (torch.tensor([x for row in lp for x in row]) - vllm).abs().max() <= 1e-5

    def one_off(kept: KeptSets) -> KeptSets:  # token t gets token t+1's set (the last keeps its own)
        starts = torch.cat([torch.zeros(1, dtype=torch.int64), kept.counts.long().cumsum(0)])
        sets = [kept.ids[starts[t] : starts[t + 1]] for t in range(len(kept))]
        return KeptSets.of(sets[1:] + sets[-1:])

    planted = [Sample(c.prompt_ids, c.completion_ids, 0.0, kept=one_off(c.kept)) for c in comps]
    lp = sequence_logprobs(model, planted, settings)
    assert (torch.tensor([x for row in lp for x in row]) - vllm).abs().max() > 1e-3
