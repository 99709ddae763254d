"""Tool tokens in the integrations: TRL's `tool_mask` is multiplied into the completion mask on fastrl's TRL path.

The batch is TRL's own layout (`GRPOTrainer._compute_loss`'s inputs): left-padded prompts, right-padded
completions, and `tool_mask` 0 on tokens a tool wrote. The old log-probs at tool tokens are wild (a stale value
the sampler never produced): a path that drops the tool mask sees them.
"""

import pytest
import torch
import trl_harness as h
from trl import GRPOTrainer

from fastrl.integrations.trl import FastRLGRPOTrainer


def _inputs(model) -> dict:
    g = torch.Generator().manual_seed(3)
    B, P, K = 4, 3, 8
    prompt_ids = torch.randint(3, 60, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[0, 0] = 0
    completion_ids = torch.randint(3, 60, (B, K), generator=g)
    completion_mask = torch.ones(B, K, dtype=torch.long)
    completion_mask[1, 6:] = 0
    tool_mask = torch.ones(B, K, dtype=torch.long)
    for row, (a, b) in enumerate([(2, 4), (1, 3), (5, 8), (0, 2)]):
        tool_mask[row, a:b] = 0
    tool_mask[2, 1:2] = 0  # a second span
    with torch.no_grad():
        ids = torch.cat([prompt_ids, completion_ids], 1)
        logits = model(input_ids=ids, attention_mask=torch.cat([prompt_mask, completion_mask], 1)).logits
        logp = logits[:, P - 1 : -1].float().log_softmax(-1).gather(-1, completion_ids[..., None])[..., 0]
    stale = logp + 0.1 * torch.randn(B, K, generator=g) + 6.0 * (tool_mask == 0)
    return dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                completion_mask=completion_mask, tool_mask=tool_mask, advantages=torch.tensor([1.0, -0.5, 0.8, -1.1]),
                old_per_token_logps=stale, num_items_in_batch=(completion_mask * tool_mask).sum())  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_trl_tool_mask_enters_fastrls_loss_as_trls(tmp_path, loss_type):
    """fastrl's loss on a batch with tool tokens equals TRL's own (which multiplies `tool_mask` into the completion
    mask); the batch's wild old log-probs at tool tokens would move it far."""
    base = h.model()
    args = h.config(tmp_path, loss_type=loss_type, beta=0.0)
    data, tok = h.dataset(), h.tokenizer()
    stock = GRPOTrainer(model=base, reward_funcs=h.reward, args=args, train_dataset=data, processing_class=tok)
    ours = FastRLGRPOTrainer(model=base, reward_funcs=h.reward, args=args, train_dataset=data, processing_class=tok)
    for trainer in (stock, ours):
        trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps  # what train() sets
    inputs = _inputs(base)
    want = float(stock.compute_loss(base, dict(inputs)))
    got = float(ours.compute_loss(base, dict(inputs)))
    assert got == pytest.approx(want, rel=1e-5, abs=1e-7)
