import copy

import pytest
import torch

from fastrl.hf import tile_mlps


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


@pytest.mark.parametrize("keep_attention", [False, True], ids=["checkpoint", "keep-attention"])
def test_checkpointed_tiled_mlp_runs_no_more_than_an_untiled_one(keep_attention):
    # the layer's recomputation stops before a tiled MLP (it keeps its own input): each MLP runs every token
    # twice (forward, then its tile's recomputation in the backward), as an untiled checkpointed MLP does
    from fastrl.hf import keep_attention_outputs

    ids = torch.randint(0, 97, (2, 23), generator=torch.Generator().manual_seed(1))
    rows_run = {}
    for tiled in (False, True):
        model = _qwen()
        kwargs = {"use_reentrant": False} | ({"context_fn": keep_attention_outputs} if keep_attention else {})
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.train()
        if tiled:
            tile_mlps(model, rows=7)
        seen = []
        for layer in model.model.layers:
            layer.mlp.gate_proj.register_forward_hook(lambda mod, args, out: seen.append(out.shape[:-1].numel()))
        model(input_ids=ids, labels=ids).loss.backward()
        rows_run[tiled] = sum(seen)
    assert rows_run == {False: 2 * 2 * ids.numel(), True: 2 * 2 * ids.numel()}


def test_checkpointed_tiled_mlp_holds_nothing_beyond_the_checkpoint():
    # between the forward and the backward a checkpointed layer keeps its input only: the tiled MLP's input
    # (the post-attention norm's output) is dropped with the rest and rebuilt by the layer's recomputation
    import weakref

    model = _qwen()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    tile_mlps(model, rows=7)
    inputs = []
    for layer in model.model.layers:
        layer.mlp.register_forward_pre_hook(lambda mod, args: inputs.append(weakref.ref(args[0])))
    ids = torch.randint(0, 97, (2, 23), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=ids, labels=ids).loss
    assert len(inputs) == 2 and all(ref() is None for ref in inputs)
    loss.backward()


def test_tiles_recompute_under_the_forwards_autocast():
    # the backward's tiles run the MLP in bfloat16 as the forward did, not in the weights' float32
    model = _qwen().float()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    tile_mlps(model, rows=7)
    dtypes = []
    for layer in model.model.layers:
        layer.mlp.gate_proj.register_forward_hook(lambda mod, args, out: dtypes.append(out.dtype))
    ids = torch.randint(0, 97, (2, 23), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    forward = len(dtypes)
    loss.backward()
    assert forward == 2 * 7 and len(dtypes) == 4 * 7  # 46 tokens in 7 tiles, 2 layers, forward then backward
    assert set(dtypes) == {torch.bfloat16}


def test_an_mlp_that_changes_the_width_is_refused_by_name():
    class WideMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up_proj = torch.nn.Linear(4, 8)

        def forward(self, x):
            return self.up_proj(x)

    mlp = WideMLP()
    tile_mlps(mlp, rows=2)
    with pytest.raises(ValueError, match=r"mapped \(5, 4\) to \(5, 8\); only MLPs that keep the hidden size"):
        mlp(torch.randn(5, 4, requires_grad=True))
