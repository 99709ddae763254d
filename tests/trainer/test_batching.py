import pytest
import torch

from fastrl.trainer.batching import Sample, collate, microbatch_cost, plan_microbatches
from fastrl.trainer.tiny import tiny_model
from fastrl.trainer.update import completion_hidden, head_params, supports_packing


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_plan_respects_budget_and_covers_all(packed):
    lengths = [5, 17, 3, 40, 12, 12, 8, 1, 30, 25]
    plan = plan_microbatches(lengths, 48, packed)
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
    for mb in plan:
        assert microbatch_cost([lengths[i] for i in mb], packed) <= 48


def test_oversized_sequence_gets_its_own_microbatch():
    plan = plan_microbatches([10, 100, 10], 32, packed=True)
    assert [1] in plan and all(microbatch_cost([[10, 100, 10][i] for i in mb], True) <= 32 for mb in plan if mb != [1])


def _samples():
    return [
        Sample([1, 12, 16], [30, 31, 2], 1.0),
        Sample([1, 13], [32, 2], -1.0),
        Sample([1, 14, 16, 17, 18], [33, 34, 35, 36, 2], 0.5),
    ]


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_gather_points_at_positions_that_predict_each_completion_token(packed):
    samples = _samples()
    mb = collate(samples, packed, pad_id=0)
    flat_ids = mb["input_ids"].reshape(-1)
    for i, s in enumerate(samples):
        n = len(s.completion_ids)
        # the token after each gathered position is the completion token it predicts
        assert flat_ids[mb["gather"][i, :n] + 1].tolist() == s.completion_ids
        assert mb["targets"][i, :n].tolist() == s.completion_ids
        assert mb["mask"][i].sum() == n


def test_packed_and_padded_give_the_same_hidden_states():
    assert supports_packing(tiny_model(64, 32, 2, 4))
    model = tiny_model(64, hidden_size=32, num_layers=2, num_heads=4, seed=1).eval()
    samples = _samples()
    with torch.no_grad():
        h_pad = completion_hidden(model, collate(samples, False, 0), bf16=False)
        h_pack = completion_hidden(model, collate(samples, True, 0), bf16=False)
    mask = collate(samples, False, 0)["mask"].bool()
    torch.testing.assert_close(h_pack[mask], h_pad[mask], rtol=1e-5, atol=1e-5)
    # and the head is the tied embedding
    w, _ = head_params(model, torch.float32)
    assert w.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_equal_lengths_pack_one_row_each_without_a_mask():
    # a group's truncated completions: same prompt, same length. One row per sequence, no block mask, and
    # the hidden states of each sequence run alone.
    model = tiny_model(64, hidden_size=32, num_layers=2, num_heads=4, seed=1).eval()
    samples = [Sample([1, 12, 16], [30 + i, 31, 33, 2], 1.0 - i) for i in range(3)]
    mb = collate(samples, True, pad_id=0)
    assert mb["input_ids"].shape == (3, 7) and mb["attention_mask"] is None
    assert mb["position_ids"].tolist() == [list(range(7))] * 3
    flat_ids = mb["input_ids"].reshape(-1)
    for i, s in enumerate(samples):
        assert flat_ids[mb["gather"][i] + 1].tolist() == s.completion_ids
    with torch.no_grad():
        h = completion_hidden(model, mb, bf16=False)
        for i, s in enumerate(samples):
            alone = completion_hidden(model, collate([s], False, 0), bf16=False)
            torch.testing.assert_close(h[i], alone[0], rtol=1e-5, atol=1e-5)


def test_mixed_optional_logprobs_raise():
    s = _samples()
    s[0].old_logprobs = [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="old_logprobs"):
        collate(s, False, 0)
