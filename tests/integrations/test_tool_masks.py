"""Tool tokens in the integrations: TRL's `tool_mask` is multiplied into the completion mask on fastrl's TRL path;
fastrl's verl policy loss reads verl's multi-turn `response_mask` (run in verl's environment).

The batch is TRL's own layout (`GRPOTrainer._compute_loss`'s inputs): left-padded prompts, right-padded
completions, and `tool_mask` 0 on tokens a tool wrote. The old log-probs at tool tokens are wild (a stale value
the sampler never produced): a path that drops the tool mask sees them.
"""

import os
import pathlib
import subprocess

import pytest
import torch
import trl_harness as h
from trl import GRPOTrainer

from fastrl.integrations.trl import FastRLGRPOTrainer

ROOT = pathlib.Path(__file__).resolve().parents[2]


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


# verl's multi-turn rollout writes `response_mask` 1 on the model's tokens and 0 on tool responses and padding
# (right-padded responses): the rows below interleave turns and tool outputs as its agent loop lays them out
VERL_SCRIPT = """
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_policy_loss_fn

import fastrl.integrations.verl  # registers "fastrl"

turns = [[(0, 3, 1), (3, 7, 0), (7, 10, 1), (10, 12, 0), (12, 14, 1)], [(0, 5, 1), (5, 6, 0), (6, 9, 1)],
         [(0, 2, 1), (2, 9, 0), (9, 16, 1)], [(0, 16, 1)]]
B, T = len(turns), 16
response_mask = torch.zeros(B, T, dtype=torch.bool)
for row, parts in enumerate(turns):
    for a, b, model_wrote in parts:
        response_mask[row, a:b] = bool(model_wrote)
tool = torch.zeros(B, T, dtype=torch.bool)
for row, parts in enumerate(turns):
    for a, b, model_wrote in parts:
        tool[row, a:b] = not model_wrote
g = torch.Generator().manual_seed(0)
old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
logp0 = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T).contiguous()
config = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
                           "global_batch_info": {"dp_size": 1, "batch_num_tokens": int(response_mask.sum()),
                                                 "global_batch_size": B}})
for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
    results = []
    for name, poison in (("vanilla", 0.0), ("fastrl", 0.0), ("fastrl", 8.0)):
        logp = logp0.clone().requires_grad_()
        loss, metrics = get_policy_loss_fn(name)(old_log_prob=old + poison * tool, log_prob=logp, advantages=adv,
                                                 response_mask=response_mask, loss_agg_mode=mode, config=config)
        loss.backward()
        results.append((float(loss.detach()), logp.grad, metrics["actor/pg_clipfrac"]))
    (ref, ref_grad, ref_clip), *ours = results
    for loss, grad, clip in ours:
        assert abs(loss - ref) <= 1e-9 + 1e-6 * abs(ref), (mode, loss, ref)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-9)
        assert abs(clip - ref_clip) < 1e-6, (mode, clip, ref_clip)  # verl logs it in float32
        assert bool((grad[tool] == 0).all())
    print("ok", mode)
"""


@pytest.mark.slow
def test_verl_response_mask_with_tool_turns(verl_python):
    """fastrl's verl policy loss on verl's multi-turn `response_mask` (zeros on tool responses) equals verl's
    vanilla loss, gradient and clip fraction, and wild old log-probs at tool tokens change none of them."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([verl_python, "-c", VERL_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    assert proc.stdout.count("ok ") == 3, proc.stdout
