"""fastrl inside the trainers people already run: TRL's `GRPOTrainer` and verl's actor.

    from fastrl.integrations.trl import FastRLGRPOTrainer      # needs trl
    import fastrl.integrations.verl                             # needs verl; registers loss_mode="fastrl"

Each of those submodules imports its trainer's package. This package imports neither: `import fastrl.integrations`
works without them and gives the peers' losses for a caller of `fastrl.policy_loss` (no trl or verl import):

    config = loss_config_from_trl(grpo_config)                  # TRL's GRPOTrainer loss
    normalizer = trl_normalizer(grpo_config, mask, num_items_in_batch=n)
    config = loss_config_from_verl(actor, rollout_correction=rc)  # verl's actor loss
    normalizer = verl_normalizer(config, dp_size=dp, batch_num_tokens=tokens, global_batch_size=rows)
"""

from .trl_compat import loss_config_from_trl, trl_normalizer
from .verl_compat import loss_config_from_verl, verl_normalizer

__all__ = ["loss_config_from_trl", "loss_config_from_verl", "trl", "trl_normalizer", "verl", "verl_normalizer"]
