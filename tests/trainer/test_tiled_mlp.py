import copy

import pytest
import torch

from fastrl.trainer.tiled_mlp import tile_mlps


def _qwen(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    return Qwen2ForCausalLM(config).double()


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_tiled_mlps_give_the_same_loss_and_gradients(checkpointing):
    ref = _qwen()
    tiled = copy.deepcopy(ref)
    assert tile_mlps(tiled, rows=7) == 2 and tile_mlps(tiled, rows=7) == 0  # idempotent
    ids = torch.randint(0, 97, (2, 23), generator=torch.Generator().manual_seed(1))
    for model in (ref, tiled):
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
    for (name, a), b in zip(ref.named_parameters(), tiled.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-12, atol=1e-12, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(tiled(input_ids=ids).logits, ref(input_ids=ids).logits, rtol=1e-12, atol=1e-12)


def test_tile_rows_must_be_positive():
    with pytest.raises(ValueError, match="rows must be >= 1, got 0"):
        tile_mlps(_qwen(), rows=0)
