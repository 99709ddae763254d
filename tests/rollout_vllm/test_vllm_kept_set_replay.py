"""vLLM's own kept sets replayed (docs/math.md §9): vLLM's min-p processor then `apply_top_k_top_p` on the same
float32 logits give each token's kept set; as `vllm.outputs.SamplingMask` objects through
`fastrl.kept_set_from_vllm`, `token_logprobs(..., kept_ids=, kept_offsets=)` gives vLLM's processed log-probs to
float32 rounding. Sets shifted by one position within their completion (a misalignment) fail the comparison."""

import torch
from test_vllm_sampler_equality import vllm_processed_logprobs
from vllm.outputs import SamplingMask

import fastrl

B, T, D, V, TAU = 4, 24, 64, 1003, 0.7


def _rollout():
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(B, T, D, generator=g)
    weight = torch.randn(V, D, generator=g) * (2.5 / D**0.5)
    lengths = torch.tensor([T, T - 5, T - 11, 7])
    completion = torch.arange(T)[None, :] < lengths[:, None]
    n = B * T
    rows = torch.arange(n)
    top_k = torch.where(rows % 3 == 0, 5 + rows % 40, torch.zeros_like(rows))
    top_p = torch.where(rows % 2 == 0, 0.8 + 0.15 * torch.rand(n, generator=g), torch.ones(n))
    min_p = torch.where(rows % 5 == 1, 0.05 * torch.rand(n, generator=g), torch.zeros(n))
    logits = (hidden.reshape(n, D) @ weight.T) / TAU
    ref = vllm_processed_logprobs(logits, top_k, top_p, min_p)  # [N, V]
    targets = torch.multinomial(ref.exp(), 1, generator=g).squeeze(1)  # a token vLLM could have sampled
    sets = [torch.nonzero(ref[i].isfinite()).squeeze(1).tolist() for i in range(n)]
    masks = [SamplingMask([sets[b * T + t] for t in range(int(lengths[b]))]) for b in range(B)]
    targets = torch.where(completion.reshape(-1), targets, -100).reshape(B, T)
    return hidden, weight, targets, completion, masks, ref, float(logits.abs().max())


def _replayed(hidden, weight, targets, completion, masks):
    ids, offsets = fastrl.kept_set_from_vllm(masks, completion)
    out = fastrl.kernels.sampled_token_logprobs(hidden, weight, targets, temperature=TAU, kept_ids=ids,
                                                kept_offsets=offsets, impl="torch")  # fmt: skip
    return out.logp, out.outside


def test_vllms_kept_sets_replayed_give_its_processed_logprobs():
    hidden, weight, targets, completion, masks, ref, z_max = _rollout()
    assert sum(len(s) < V for m in masks for s in m.token_ids) >= B * T // 3  # the case truncates
    logp, outside = _replayed(hidden, weight, targets, completion, masks)
    live = completion.reshape(-1)
    want = ref.gather(1, targets.reshape(-1).clamp(min=0)[:, None])[:, 0]
    assert not outside.any()
    # float32 rounding: the two compute each logit in another order (a GEMM vs one dot per kept pair), a few
    # ulps of the largest logit apart
    tol = 8 * torch.finfo(torch.float32).eps * z_max
    torch.testing.assert_close(logp.reshape(-1)[live], want[live], rtol=0, atol=tol)
    assert logp.reshape(-1)[~live].eq(0).all()


def test_a_one_position_misalignment_fails():
    hidden, weight, targets, completion, masks, ref, _ = _rollout()
    shifted = [SamplingMask(m.token_ids[1:] + m.token_ids[:1]) for m in masks]
    logp, outside = _replayed(hidden, weight, targets, completion, shifted)
    live = completion.reshape(-1)
    want = ref.gather(1, targets.reshape(-1).clamp(min=0)[:, None])[:, 0]
    err = (logp.reshape(-1)[live] - want[live]).abs().max()
    assert outside.any() or err > 1e-3, err
    assert err > 1e-3
