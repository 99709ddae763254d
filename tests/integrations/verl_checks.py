"""fastrl inside verl, checked against verl's own code; runs in verl's environment (`.ci/verl.sh`):

    PYTHONPATH=<repo> <verl python> tests/integrations/verl_checks.py

1. loss_mode="fastrl" against verl's real "vanilla" policy loss, every `loss_agg_mode`, with and without
   the engine's global batch counts and rollout IS weights: the same loss, gradient and metrics.
2. The actor's micro-batch step on CPU: verl's fused-kernel forward (verl's own torch backend vs the one
   `fastrl.integrations.verl` installs through verl's `patch_forward_with_backends`), the policy loss, verl's
   entropy term (`agg_loss`) and backward, on a tiny random Qwen2: the same log-probs, entropy, loss,
   metrics and parameter gradients.
3. A head wrapped as its own FSDP1 unit is refused with a message naming it.

Prints one line per case; exits non-zero at the first mismatch.
"""

import copy
import itertools

import torch
from omegaconf import OmegaConf
from transformers import Qwen2Config, Qwen2ForCausalLM
from verl.models.transformers.monkey_patch import patch_forward_with_backends
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn

from fastrl.integrations.verl import VERL_FORWARDS, forward_with_fastrl_backend

MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def _close(name, got, want, rtol=1e-6, atol=1e-9):
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def _metrics_close(got, want):
    assert got.keys() == want.keys(), (got.keys(), want.keys())
    for key, value in want.items():
        assert abs(got[key] - value) <= 1e-6 * abs(value) + 1e-9, (key, got[key], value)


def _actor(batch_info):
    return OmegaConf.create(
        {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
         "loss_scale_factor": 16, "global_batch_info": {"loss_scale_factor": 16, **batch_info}}
    )  # fmt: skip


def check_policy_loss(mode, batch_info, with_weights):
    g = torch.Generator().manual_seed(0)
    b, t = 6, 37
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    logp0 = old + 0.4 * torch.randn(b, t, generator=g, dtype=torch.float64)
    adv = torch.randn(b, 1, generator=g, dtype=torch.float64).expand(b, t).contiguous()
    mask = torch.rand(b, t, generator=g) < 0.8
    mask[2] = False  # a sequence with no live token
    weights = torch.rand(b, t, generator=g, dtype=torch.float64) * 2 if with_weights else None
    results = []
    for name in ("vanilla", "fastrl"):
        logp = logp0.clone().requires_grad_()
        loss, metrics = get_policy_loss_fn(name)(
            old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, loss_agg_mode=mode,
            config=_actor(batch_info), rollout_is_weights=weights,
        )  # fmt: skip
        loss.backward()
        results.append((loss.detach().double(), logp.grad, metrics))
    (ref_loss, ref_grad, ref_metrics), (loss, grad, metrics) = results
    _close("loss", loss, ref_loss)
    _close("d logp", grad, ref_grad)
    _metrics_close(metrics, ref_metrics)


B, P, R, V = 3, 5, 7, 97


def _model():
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).float()


def _actor_step(model, loss_mode, mode, batch):
    input_ids, attention_mask, old, adv, response_mask = batch
    out = model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True, temperature=0.7)
    log_prob = out.log_probs[:, P - 1 : -1]  # position t scores token t + 1: the R response tokens
    entropy = out.entropy[:, P - 1 : -1]
    config = _actor({"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None})
    pg_loss, metrics = get_policy_loss_fn(loss_mode)(
        old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=response_mask, loss_agg_mode=mode,
        config=config,
    )  # fmt: skip
    loss = pg_loss - 0.01 * agg_loss(entropy, response_mask, mode, **config.global_batch_info)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), log_prob.detach(), entropy.detach().float(), grads, metrics


def check_actor_step(mode):
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, V, (B, P + R), generator=g)
    attention_mask = torch.ones(B, P + R, dtype=torch.long)
    response_mask = torch.rand(B, R, generator=g) < 0.8
    old = -torch.rand(B, R, generator=g) * 4 - 2
    adv = torch.randn(B, 1, generator=g).expand(B, R).contiguous()
    batch = (input_ids, attention_mask, old, adv, response_mask)
    cls, base = Qwen2ForCausalLM, _model()
    original = cls.forward
    try:
        cls.forward = VERL_FORWARDS["torch"]
        ref = _actor_step(copy.deepcopy(base), "vanilla", mode, batch)
        cls.forward = original
        model = copy.deepcopy(base)
        patch_forward_with_backends(model, use_fused_kernels=True, fused_kernels_backend="torch")
        assert cls.forward is forward_with_fastrl_backend, "verl did not install fastrl's backend"
        ours = _actor_step(model, "fastrl", mode, batch)
    finally:
        cls.forward = original
    for name, a, b in zip(("loss", "log_probs", "entropy"), ref[:3], ours[:3]):
        _close(name, b, a, rtol=1e-5, atol=1e-6)
    assert ref[3].keys() == ours[3].keys()
    for name, grad in ref[3].items():
        _close(name, ours[3][name], grad, rtol=1e-5, atol=1e-7)
    _metrics_close(ours[4], ref[4])


def check_fsdp1_head_refused():
    """A head wrapped as its own FSDP1 unit cannot be gathered by the fused forward: refused, naming it."""
    import os
    import tempfile

    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel

    from fastrl.integrations.verl import _head_unit

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'rdv')}", rank=0, world_size=1)
        try:
            model = _model()
            model.lm_head = FullyShardedDataParallel(model.lm_head, device_id=torch.device("cpu"))
            try:
                _head_unit(model)
            except ValueError as e:
                assert "FSDP1" in str(e) and "Qwen2ForCausalLM" in str(e), e
            else:
                raise AssertionError("an FSDP1-wrapped head was not refused")
            assert _head_unit(_model()) is None  # an unwrapped head: read directly
        finally:
            dist.destroy_process_group()


def main():
    infos = ({}, {"dp_size": 2, "batch_num_tokens": 300, "global_batch_size": 11})
    for mode, info, weights in itertools.product(MODES, infos, (False, True)):
        check_policy_loss(mode, info, weights)
        print(f"ok policy loss {mode} batch_info={info} is_weights={weights}")
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        check_actor_step(mode)
        print(f"ok actor step {mode}")
    check_fsdp1_head_refused()
    print("ok FSDP1-wrapped head refused")


if __name__ == "__main__":
    main()
