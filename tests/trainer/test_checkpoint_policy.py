import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fastrl.hf import ATTENTION_OPS, keep_attention_outputs


class _CountAttention(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func in ATTENTION_OPS
        return func(*args, **(kwargs or {}))


def _qwen():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         attn_implementation="sdpa")  # fmt: skip
    return Qwen2ForCausalLM(config).double()


@pytest.mark.parametrize("policy", ["plain", "keep_attention"])
def test_checkpointed_layers_run_attention_once_with_the_policy(policy):
    ref = _qwen()
    model = copy.deepcopy(ref)
    kwargs = {"use_reentrant": False}
    if policy == "keep_attention":
        kwargs["context_fn"] = keep_attention_outputs
    model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    ids = torch.randint(0, 97, (2, 29), generator=torch.Generator().manual_seed(1))
    ref.train(), model.train()
    ref(input_ids=ids, labels=ids).loss.backward()
    with _CountAttention() as count:
        model(input_ids=ids, labels=ids).loss.backward()
    # 3 layers: the fused kernel runs once a layer in the forward, and again in the backward's recompute
    # unless the policy keeps its outputs
    assert count.calls == (3 if policy == "keep_attention" else 6)
    for (name, a), b in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-12, atol=1e-12, msg=name)
