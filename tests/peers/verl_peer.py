"""Run verl's own loss code on cases saved by the parity tests (verl imported unmodified).

Runs in verl's own environment (`.ci/verl.sh` builds it):
    python verl_peer.py run cases.pt out.pt    each case through verl's rollout correction and ppo_loss

A case whose "actor" is None takes verl's default actor and rollout-correction config (its result records them
under "actor" and "rollout_correction"): the defaults are read and used in the one run of verl's python.

ppo_loss is the engine worker's actor loss: it takes the packed model output (one prompt token and
T response positions per row here, the log-probs shifted by one as a causal LM's are) and the
mini-batch's global counts, and aggregates the policy, entropy and KL terms with verl's agg_loss.
"""

import os
import sys
import traceback

import torch
from tensordict import TensorDict
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask
from verl.utils import tensordict_utils as tu
from verl.workers.config import FSDPActorConfig, PolicyLossConfig
from verl.workers.utils.losses import ppo_loss

# the actor fields verl's loss reads; a full actor section (e.g. verl's defaults) is cut to these
LOSS_FIELDS = (
    "clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "loss_agg_mode", "loss_scale_factor",
    "entropy_coeff", "use_kl_loss", "kl_loss_coef", "kl_loss_type", "tau_pos", "tau_neg", "policy_loss",
)  # fmt: skip


def actor_config(d):
    """verl's FSDP actor config with the case's loss fields (the others at verl's defaults)."""
    d = {k: v for k, v in d.items() if k in LOSS_FIELDS}
    policy = PolicyLossConfig(**{k: v for k, v in d.pop("policy_loss", {}).items() if k != "_target_"})
    return FSDPActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=policy, **d)


def run_case(case):
    cfg = actor_config(case["actor"])
    mask = case["mask"].bool()
    old, rollout = case["old"], case.get("rollout")
    weights = None
    corr = case.get("rollout_correction")
    if corr:
        proto, mask, _ = compute_rollout_correction_and_rejection_mask(
            old_log_prob=old,
            rollout_log_prob=rollout,
            response_mask=mask,
            rollout_is=corr.get("rollout_is"),
            rollout_is_threshold=corr.get("rollout_is_threshold", 2.0),
            rollout_is_batch_normalize=corr.get("rollout_is_batch_normalize", False),
            rollout_rs=corr.get("rollout_rs"),
            rollout_rs_threshold=corr.get("rollout_rs_threshold"),
        )
        weights = None if proto is None else proto.batch["rollout_is_weights"]
        mask = mask.bool()
    logp = case["logp"].clone().requires_grad_()
    entropy = None if case.get("entropy") is None else case["entropy"].clone().requires_grad_()
    losses = []
    for rows in case["micro_batches"]:
        rows = torch.as_tensor(rows)
        B, T = len(rows), logp.shape[1]
        # the packed model output: per row one prompt token, T response positions (output shifted by one)
        flat_lp = torch.cat([logp[rows], torch.zeros(B, 1, dtype=logp.dtype)], dim=1).reshape(-1)
        out = {"log_probs": flat_lp}
        if entropy is not None:
            out["entropy"] = torch.cat([entropy[rows], torch.zeros(B, 1, dtype=logp.dtype)], dim=1).reshape(-1)
        fields = {
            "prompts": torch.zeros(B, 1, dtype=torch.long),
            "responses": torch.zeros(B, T, dtype=torch.long),
            "attention_mask": torch.ones(B, 1 + T, dtype=torch.long),
            "response_mask": mask[rows].long(),
            "old_log_probs": old[rows],
            "advantages": case["adv"][rows],
        }
        if weights is not None:
            fields["rollout_is_weights"] = weights[rows]
        if case.get("ref") is not None:
            fields["ref_log_prob"] = case["ref"][rows]
        data = TensorDict(fields, batch_size=[B])
        g = case.get("global", {})
        tu.assign_non_tensor(
            data,
            dp_size=g.get("dp_size", 1),
            batch_num_tokens=g.get("batch_num_tokens"),
            global_batch_size=g.get("global_batch_size"),
        )
        loss, _ = ppo_loss(cfg, out, data)
        losses.append(loss)
    total = sum(losses)
    total.backward()
    return {
        "losses": [x.detach() for x in losses],
        "grad_logp": logp.grad,
        "grad_entropy": None if entropy is None else entropy.grad,
        "mask": mask,
        "weights": weights,
    }


def defaults() -> dict:
    """verl's default actor and rollout-correction sections, as plain containers."""
    import verl
    from omegaconf import OmegaConf

    path = os.path.join(os.path.dirname(verl.__file__), "trainer", "config", "_generated_ppo_trainer.yaml")
    cfg = OmegaConf.load(path)
    return {
        "actor": OmegaConf.to_container(cfg.actor_rollout_ref.actor, resolve=True),
        "rollout_correction": OmegaConf.to_container(cfg.algorithm.rollout_correction, resolve=True),
    }


def run(src, dst):
    cases = torch.load(src, weights_only=False)
    results = {}
    for name, case in cases.items():
        default = defaults() if case["actor"] is None else {}
        try:
            results[name] = {**run_case({**case, **default}), **default}
        except Exception as e:  # reported per case: the test names the case that verl rejected
            results[name] = {"error": f"{type(e).__name__}: {e}\n" + traceback.format_exc(), **default}
    torch.save(results, dst)


if __name__ == "__main__":
    {"run": run}[sys.argv[1]](*sys.argv[2:])
