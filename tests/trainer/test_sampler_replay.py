"""Replaying the sampler's kept sets in the trainer (docs/math.md §9): the samples' int32 sets, their CSR in a
micro-batch, the HF engine's recorder, the loss and the log-prob passes on the sets, `--sampler-replay`."""

import pytest
import torch

import fastrl
from fastrl.trainer.batching import KeptSets, Sample, collate
from fastrl.trainer.build import build_model
from fastrl.trainer.config import ConfigError, make_config
from fastrl.trainer.rollout import make_engine
from fastrl.trainer.rollout.sampling import resolve_replay
from fastrl.trainer.scoring import to_samples
from fastrl.trainer.update import StepSettings, sequence_logprobs, train_step


def _samples():
    return [
        Sample([1, 12, 16], [30, 31, 2], 1.0, kept=KeptSets.of([[30, 7], [5, 31, 9], [2]])),
        Sample([1, 13], [32, 2], -1.0, kept=KeptSets.of([[32], [2, 3, 4, 5]])),
        Sample([1, 14], [33, 34, 2], 0.5, token_mask=[1.0, 0.0, 1.0], kept=KeptSets.of([[33, 1], [], [2]])),
    ]


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_collate_lays_the_sets_out_over_the_flattened_rows(packed):
    samples = _samples()
    mb = collate(samples, packed, pad_id=0)
    ids, offsets, tc = mb["kept_ids"], mb["kept_offsets"], mb["targets"].shape[1]
    assert ids.dtype == torch.int32 and offsets.dtype == torch.int64 and offsets.numel() == len(samples) * tc + 1
    for i, s in enumerate(samples):
        for t in range(tc):
            row = ids[offsets[i * tc + t] : offsets[i * tc + t + 1]].tolist()
            start = int(s.kept.counts[:t].sum())
            want = s.kept.ids[start : start + int(s.kept.counts[t])].tolist() if t < len(s.kept) else []
            assert row == want  # padding positions empty
    assert not mb["kept_missing"].any()
    assert mb["mask"].tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 1.0]]


def test_a_target_missing_from_its_set_is_masked_and_flagged():
    samples = _samples()
    samples[1].kept = KeptSets.of([[32], [3, 4, 5]])  # its end token (2) was not kept
    mb = collate(samples, False, pad_id=0)
    assert mb["kept_missing"].nonzero().tolist() == [[1, 1]]
    assert mb["mask"][1].tolist() == [1.0, 0.0, 0.0]


def test_kept_sets_refuse_bad_data():
    with pytest.raises(TypeError, match="int32"):
        KeptSets(torch.tensor([1, 2]), torch.tensor([2], dtype=torch.int32))
    with pytest.raises(ValueError, match="sum to 3"):
        KeptSets(torch.tensor([1, 2], dtype=torch.int32), torch.tensor([3], dtype=torch.int32))
    samples = _samples()
    samples[0].kept = None
    with pytest.raises(ValueError, match="some sequences"):
        collate(samples, False, 0)
    samples = _samples()
    samples[0].kept = KeptSets.of([[30], [31]])
    with pytest.raises(ValueError, match="2 kept sets for 3 completion tokens"):
        collate(samples, False, 0)


def test_config_flag():
    assert make_config("tiny").sampler_replay == "auto"
    with pytest.raises(ConfigError, match="sampler_replay"):
        make_config("tiny", sampler_replay="yes")
    with pytest.raises(ConfigError, match="nothing is truncated"):
        make_config("tiny", sampler_replay="on")
    assert make_config("tiny", sampler_replay="on", top_k=5, engine="vllm", async_staleness=0).sampler_replay == "on"


@pytest.fixture(scope="module")
def hf_rollout():
    """The tiny model sampling on the HF engine at top-k 6, top-p 0.9, T 0.7, with replay (the default)."""
    config = make_config("tiny", top_k=6, top_p=0.9, temperature=0.7, is_cap=2.0, group_size=4)
    torch.manual_seed(0)
    model, tokenizer = build_model(config, torch.device("cpu"))
    engine = make_engine("hf", model, tokenizer, config)
    prompts = [tokenizer.encode(q, add_special_tokens=True) for q in ("3+4=", "12+9=")]
    torch.manual_seed(1)
    comps = engine.generate(prompts, 4, want_logprobs=True)
    return config, model.eval(), tokenizer, comps


def test_hf_engine_records_the_sets_it_sampled_from(hf_rollout):
    config, model, _, comps = hf_rollout
    for c in comps:
        assert len(c.kept) == len(c.completion_ids)
        with torch.no_grad():
            hidden = model.model(torch.tensor([c.prompt_ids + c.completion_ids])).last_hidden_state
        hidden = hidden[0, len(c.prompt_ids) - 1 : -1]
        targets = torch.tensor(c.completion_ids)
        # the θ path of the same truncation (an independent implementation) finds the same sets
        _, ids, lps = fastrl.token_logprobs(hidden, model.lm_head.weight, targets, temperature=0.7, top_k=6,
                                            top_p=0.9, return_topk=6)  # fmt: skip
        theta = [set(i[lp.isfinite()].tolist()) for i, lp in zip(ids, lps)]
        starts = torch.cat([torch.zeros(1, dtype=torch.int64), c.kept.counts.cumsum(0)])
        recorded = [set(c.kept.ids[starts[t] : starts[t + 1]].tolist()) for t in range(len(c.kept))]
        assert recorded == theta
        assert all(t in s for t, s in zip(c.completion_ids, recorded))
        assert max(len(s) for s in recorded) <= 6 and min(len(s) for s in recorded) >= 1


def test_trainer_replays_the_hf_sets(hf_rollout, monkeypatch):
    config, model, tokenizer, comps = hf_rollout
    samples = to_samples(comps, [1.0, -1.0] * 4, torch.zeros(2, dtype=torch.bool), config)
    settings = StepSettings(config.loss, 4096, True, tokenizer.pad_token_id, impl="torch", bf16=False)
    logp = sequence_logprobs(model, samples, settings)
    got, want = torch.tensor(sum(logp, [])), torch.tensor(sum((c.logprobs for c in comps), []))
    assert (got - want).abs().max() < 1e-5
    calls = []
    real = fastrl.trainer.update.grpo_loss

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(fastrl.trainer.update, "grpo_loss", spy)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    out = train_step(model, opt, samples, settings)
    assert all(k["kept_ids"] is not None and k["top_k"] == 0 for k in calls)  # the sets, no θ truncation
    assert out["replay_missing_tokens"] == 0
    n = out["num_tokens"]
    # a target outside its set (a misaligned set, here): counted, left out of the loss, never an error or a NaN
    s = samples[0]
    first = s.kept.ids[: int(s.kept.counts[0])]
    s.kept = KeptSets(torch.cat([first[first != s.completion_ids[0]], s.kept.ids[len(first) :]]),
                      torch.cat([s.kept.counts[:1] - 1, s.kept.counts[1:]]))  # fmt: skip
    out = train_step(model, opt, samples, settings)
    assert out["replay_missing_tokens"] == 1 and out["num_tokens"] == n - 1
    assert torch.isfinite(torch.tensor(out["loss"]))
    assert all(torch.isfinite(torch.tensor(row)).all() for row in sequence_logprobs(model, samples, settings))


def test_replay_off_and_nothing_to_replay(capsys):
    config = make_config("tiny", top_k=6, sampler_replay="off")
    model, tokenizer = build_model(config, torch.device("cpu"))
    assert not make_engine("hf", model, tokenizer, config).replay
    assert not make_engine("hf", model, tokenizer, make_config("tiny")).replay  # nothing truncated: silent
    assert "sampler_replay" not in capsys.readouterr().err
    comps = make_engine("hf", model, tokenizer, config).generate([tokenizer.encode("1+1=")], 2)
    assert all(c.kept is None for c in comps)


def test_an_engine_that_cannot_record(capsys):
    """auto: the θ path, said on stderr; on: a ConfigError naming the reason."""
    assert not resolve_replay(make_config("tiny", top_k=6), "the engine core runs elsewhere")
    assert "sampler_replay=auto" in capsys.readouterr().err
    assert resolve_replay(make_config("tiny", top_k=6), None)
    with pytest.raises(ConfigError, match="the engine core runs elsewhere"):
        resolve_replay(make_config("tiny", top_k=6, sampler_replay="on"), "the engine core runs elsewhere")
