import pytest
import torch

from fastrl.losses import LossConfig
from fastrl.trainer.batching import KeptSets, Sample
from fastrl.trainer.config import make_config
from fastrl.trainer.rollout import HFEngine, trim_completion
from fastrl.trainer.tiny import CharTokenizer, tiny_model
from fastrl.trainer.update import StepSettings, sequence_logprobs, train_step


def make_samples(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = torch.randint(3, 60, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
        c = torch.randint(3, 60, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
        out.append(Sample([1] + p, c, float(torch.randn(1, generator=g)), loss_mask=i != 3))
    return out


def step_delta(samples, agg, budget, packed, old=False):
    """Parameter change of one SGD(lr=1) step = minus the accumulated gradient."""
    model = tiny_model(64, hidden_size=32, num_layers=2, num_heads=4, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    if old:
        for s, lp in zip(samples, sequence_logprobs(model, samples, StepSettings(LossConfig(), 1 << 20, packed, 0))):
            s.old_logprobs = [x + (0.3 if j % 2 else -0.3) for j, x in enumerate(lp)]  # stale: some ratios clip
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    cfg = LossConfig(loss_agg=agg, max_completion_length=8)
    m = train_step(model, opt, samples, StepSettings(cfg, budget, packed, pad_id=0, max_grad_norm=0.0))
    return [b - p.detach() for b, p in zip(before, model.parameters())], m


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_microbatching_is_exact_gradient_accumulation(agg, packed):
    whole, m_whole = step_delta(make_samples(), agg, budget=1 << 20, packed=packed, old=True)
    split, m_split = step_delta(make_samples(), agg, budget=12, packed=packed, old=True)
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert abs(m_whole["loss"] - m_split["loss"]) < 1e-5
    assert m_whole["num_tokens"] == m_split["num_tokens"] > 0 and m_whole["update_skipped"] == 0.0
    assert 0 < m_whole["clip_frac_high"] + m_whole["clip_frac_low"] <= 1


def test_packed_and_padded_steps_agree():
    a, _ = step_delta(make_samples(), "token-mean", budget=20, packed=True)
    b, _ = step_delta(make_samples(), "token-mean", budget=20, packed=False)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)


def test_the_step_takes_its_settings_only_as_one_object():
    model = tiny_model(64, hidden_size=32, num_layers=2, num_heads=4, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    with pytest.raises(TypeError, match="settings must be a StepSettings, got LossConfig"):
        train_step(model, opt, make_samples(), LossConfig())
    with pytest.raises(TypeError, match="settings must be a StepSettings, got int"):
        sequence_logprobs(model, make_samples(), 20)
    with pytest.raises(ValueError, match="budget must be a positive int"):
        StepSettings(LossConfig(), 0, True, 0)


def test_all_masked_step_is_a_no_op():
    samples = [Sample([1, 5], [6, 7], 1.0, loss_mask=False)]
    delta, m = step_delta(samples, "token-mean", budget=64, packed=True)
    assert all(d.abs().max() == 0 for d in delta) and m["loss"] == 0.0 and m["update_skipped"] == 1.0


def test_rollout_logprobs_match_the_trainer_recompute():
    """HF generate with left-padded prompts samples from the same distribution the update scores."""
    tok = CharTokenizer()
    model = tiny_model(len(tok), hidden_size=32, num_layers=2, num_heads=4, seed=0)
    # model defaults that would change the sampling distribution must not leak into rollouts
    model.generation_config.repetition_penalty, model.generation_config.top_k = 1.5, 3
    torch.manual_seed(0)
    engine = HFEngine(model, tok, make_config(max_completion_length=6, temperature=0.7))
    prompts = [tok.encode("3+4=", add_special_tokens=True), tok.encode("12+345=", add_special_tokens=True)]
    comps = engine.generate(prompts, n=3, want_logprobs=True)
    assert len(comps) == 6 and all(c.prompt_ids == prompts[i // 3] for i, c in enumerate(comps))
    samples = [Sample(c.prompt_ids, c.completion_ids, 0.0) for c in comps]
    recomputed = sequence_logprobs(model, samples, StepSettings(LossConfig(temperature=0.7), 1 << 20, True, 0))
    for c, lp in zip(comps, recomputed):
        torch.testing.assert_close(torch.tensor(lp), torch.tensor(c.logprobs), rtol=1e-4, atol=1e-4)


def test_activation_checkpointing_gives_the_same_step():
    def delta(checkpointing):
        model = tiny_model(64, hidden_size=32, num_layers=2, num_heads=4, seed=0)
        if checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            assert model.is_activation_checkpointing
        before = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        train_step(model, opt, make_samples(), StepSettings(LossConfig(), 20, True, 0, max_grad_norm=0))
        return [b - p.detach() for b, p in zip(before, model.parameters())]

    for a, b in zip(delta(False), delta(True)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_trim_completion_stops_at_any_end_token():
    assert trim_completion([5, 6, 9, 2, 0, 0], {2, 9}) == ([5, 6, 9], False)
    assert trim_completion([5, 6, 7], {2}) == ([5, 6, 7], True)


def test_a_token_missing_from_its_kept_set_is_out_of_the_token_mean_normalizer():
    """A live token whose target is not in its kept set leaves the loss and the token-mean normalizer alike: the
    step equals the one whose token mask drops that token."""

    def step(missing: bool) -> dict:
        samples = make_samples()
        for s in samples:  # the target and its successor kept at every token
            s.kept = KeptSets.of([[t, (t + 1) % 64] for t in s.completion_ids])
        s = next(s for s in samples if s.loss_mask and len(s.completion_ids) > 2)
        if missing:
            sets = [[t, (t + 1) % 64] for t in s.completion_ids]
            s.kept = KeptSets.of(sets[:1] + [sets[1][1:]] + sets[2:])  # token 1's target left out
        else:
            s.token_mask = [0.0 if j == 1 else 1.0 for j in range(len(s.completion_ids))]
        model = tiny_model(64, hidden_size=32, num_layers=2, num_heads=4, seed=0)
        settings = StepSettings(LossConfig(loss_agg="token-mean", top_k=2), 64, True, 0, max_grad_norm=0.0)
        return train_step(model, torch.optim.SGD(model.parameters(), lr=1.0), samples, settings)

    missing, masked = step(missing=True), step(missing=False)
    assert (missing["replay_missing_tokens"], masked["replay_missing_tokens"]) == (1.0, 0.0)
    assert missing["num_tokens"] == masked["num_tokens"]
    assert missing["loss"] == pytest.approx(masked["loss"], rel=1e-6) and masked["loss"] != 0
    assert missing["grad_norm"] == pytest.approx(masked["grad_norm"], rel=1e-6)
