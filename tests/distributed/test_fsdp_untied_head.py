"""`--fsdp` with an untied LM head on a Qwen2 architecture: 2 gloo ranks take the 1-process steps.

The model is built from a Qwen2 config (random weights, `tie_word_embeddings=False`, q/k/v biases, grouped
KV heads), so the head is a Parameter of its own, sharded by rows with the root group's other weights and
gathered only while `run_sharded` runs the loss. Two AdamW steps (clipped) on an uneven batch split over the
ranks must give the single process's losses, log-probs and parameters (fp32, rel 1e-5).

The planted variant reads the head the way a fused path that skips FSDP would: the sharded weight,
all-gathered by hand outside the root group's hooks. Its forward is right but the head's gradient is then
never summed over the ranks, and the comparison must catch it.
"""

import pytest
import torch
from _batches import uneven_batch
from _spawn import spawn

from fastrl.losses import LossConfig
from fastrl.trainer import distributed as dist_utils
from fastrl.trainer import update
from fastrl.trainer.fsdp import shard_model
from fastrl.trainer.update import StepSettings, sequence_logprobs, train_step

BUDGET = 24
CONFIG = LossConfig(loss_agg="token-mean", eps_high=0.28)


def qwen2_untied():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=67, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False, attn_implementation="sdpa",
    )  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():  # a head unlike the embedding, with peaked distributions
            model.lm_head.weight.normal_(0, 0.3)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    return model


def two_steps(model, samples):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(2):
        m = train_step(model, opt, samples, StepSettings(CONFIG, BUDGET, True, 0, max_grad_norm=1.0))
        losses.append(m["loss"])
    return losses, sequence_logprobs(model, samples, StepSettings(LossConfig(), BUDGET, True, 0))


def _worker(rank, world, out_dir, planted):
    model = shard_model(qwen2_untied())
    head = dict(model.named_parameters())["lm_head.weight"]
    assert head.to_local().shape[0] < head.shape[0]  # the head is sharded by rows
    if planted:
        update.head_params = lambda m, dtype: (head.full_tensor().to(dtype), None)
    losses, logp = two_steps(model, dist_utils.shard(uneven_batch()))
    params = {n: p.full_tensor() for n, p in model.named_parameters()}
    torch.save(dict(params=params, losses=losses, logp=logp), f"{out_dir}/rank{rank}.pt")


def _compare(tmp_path):
    torch.set_num_threads(1)
    ref = qwen2_untied()
    start = {n: p.detach().clone() for n, p in ref.named_parameters()}
    losses, logp = two_steps(ref, uneven_batch())
    assert (start["lm_head.weight"] - ref.lm_head.weight).abs().max() > 1e-4  # the steps moved the head
    worst = {"loss": 0.0, "logp": 0.0, "params": 0.0}  # max rel loss, max abs log-prob and parameter
    for r in range(2):
        got = torch.load(tmp_path / f"rank{r}.pt")
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(losses), rtol=1e-5, atol=1e-7)
        for i, lp in zip(range(4 * r, 4 * r + 4), got["logp"]):
            torch.testing.assert_close(torch.tensor(lp), torch.tensor(logp[i]), rtol=1e-5, atol=1e-6)
            worst["logp"] = max(worst["logp"], float((torch.tensor(lp) - torch.tensor(logp[i])).abs().max()))
        for name, p in ref.named_parameters():
            want = p.detach()
            torch.testing.assert_close(got["params"][name], want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
            worst["params"] = max(worst["params"], float((got["params"][name].detach() - want).abs().max()))
        worst["loss"] = max(worst["loss"], *(abs(a - b) / abs(b) for a, b in zip(got["losses"], losses)))
    print(f"2 ranks vs 1 process, untied Qwen2 head: max rel loss {worst['loss']:.1e}; max abs log-prob "
          f"{worst['logp']:.1e}, parameter {worst['params']:.1e}")  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fsdp_untied_qwen2_head_steps_equal_single_process(tmp_path):
    spawn(_worker, 2, tmp_path, str(tmp_path), False)
    _compare(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_head_gathered_outside_fsdp_hooks_is_caught(tmp_path):
    spawn(_worker, 2, tmp_path, str(tmp_path), True)
    with pytest.raises(AssertionError, match="not close"):  # the head's step, then every later loss, is off
        _compare(tmp_path)
