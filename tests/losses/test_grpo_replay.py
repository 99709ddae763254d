"""`grpo_loss(..., kept_ids=, kept_offsets=)` and `GRPOLoss` replay the sampler's kept sets (docs/math.md §9)."""

import pytest
import torch

from fastrl import GRPOLoss, LossConfig, grpo_loss, policy_loss, token_logprobs
from fastrl.kernels import replay_logprobs_reference

B, T, D, V = 2, 6, 8, 13


def _problem(seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, D, generator=gen)
    weight = torch.randn(V, D, generator=gen) * 0.5
    targets = torch.randint(0, V, (B, T), generator=gen)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :2] = False  # a prompt: its positions keep sets too, which the loss ignores
    mask[1, -1] = False
    sets = []
    for y in targets.reshape(-1).tolist():
        size = int(torch.randint(1, 6, (), generator=gen))
        ids = [v for v in torch.randperm(V, generator=gen).tolist() if v != y][: size - 1] + [y]
        sets.append(ids)
    ids = torch.tensor([x for s in sets for x in s], dtype=torch.int32)
    offsets = torch.tensor([0] + [len(s) for s in sets]).cumsum(0)
    adv = torch.randn(B, generator=gen)
    old = torch.randn(B, T, generator=gen) * 0.1 - 2.0
    return hidden, weight, targets, mask, adv, old, ids, offsets


def test_grpo_loss_replays_the_kept_sets_against_a_float64_reference():
    hidden, weight, targets, mask, adv, old, ids, offsets = _problem()
    config = LossConfig(beta=0.0, entropy_coef=0.01, temperature=0.8)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    out = grpo_loss(h, w, targets, mask, adv, old_logprobs=old, config=config, kept_ids=ids, kept_offsets=offsets,
                    impl="torch")  # fmt: skip
    out.loss.backward()
    h64, w64 = hidden.double().requires_grad_(), weight.double().requires_grad_()
    ref = replay_logprobs_reference(h64.reshape(B * T, D), w64, targets.reshape(-1), ids, offsets, temperature=0.8)
    want = policy_loss(ref["logp"].reshape(B, T), adv, mask, old_logprobs=old.double(),
                       entropy=ref["entropy"].reshape(B, T), config=config)  # fmt: skip
    want.loss.backward()
    torch.testing.assert_close(out.loss.double(), want.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h.grad.double(), h64.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(w.grad.double(), w64.grad, rtol=1e-4, atol=1e-6)
    plain = grpo_loss(hidden, weight, targets, mask, adv, old_logprobs=old, config=config, impl="torch")
    assert abs(float(plain.loss) - float(out.loss)) > 1e-3  # the sets change the loss: not the plain path


def test_grpo_module_and_the_missing_target_rule():
    hidden, weight, targets, mask, adv, old, ids, offsets = _problem()
    module = GRPOLoss(beta=0.0, impl="torch")
    ok = module(hidden, weight, targets, mask, adv, old_logprobs=old, kept_ids=ids, kept_offsets=offsets)
    assert torch.isfinite(ok.loss)
    moved = targets.clone()
    row = int(offsets.diff()[4 + 0].item())  # position (0, 4) is live
    moved[0, 4] = next(v for v in range(V) if v not in ids[offsets[4] : offsets[4] + row].tolist())
    with pytest.raises(ValueError, match=r"target at position \(0, 4\) is not in its kept set"):
        module(hidden, weight, moved, mask, adv, kept_ids=ids, kept_offsets=offsets)
    mask2 = mask.clone()
    mask2[0, 4] = False  # masked out, its set is ignored
    assert torch.isfinite(module(hidden, weight, moved, mask2, adv, kept_ids=ids, kept_offsets=offsets).loss)


def test_kept_sets_refuse_truncation_rules_a_group_and_half_a_csr():
    hidden, weight, targets, mask, adv, old, ids, offsets = _problem()
    with pytest.raises(ValueError, match="top_k cannot be combined with kept_ids"):
        grpo_loss(hidden, weight, targets, mask, adv, config=LossConfig(top_k=5), kept_ids=ids, kept_offsets=offsets)
    h2, t2 = hidden.reshape(B * T, D), targets.reshape(-1)
    with pytest.raises(ValueError, match="top_p cannot be combined with kept_ids"):
        token_logprobs(h2, weight, t2, top_p=0.9, kept_ids=ids, kept_offsets=offsets)
    with pytest.raises(ValueError, match="not supported with process_group"):
        token_logprobs(h2, weight, t2, process_group=object(), kept_ids=ids, kept_offsets=offsets)
    with pytest.raises(ValueError, match="kept_ids and kept_offsets come together"):
        token_logprobs(h2, weight, t2, kept_ids=ids)
