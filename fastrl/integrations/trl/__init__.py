"""fastrl inside TRL: `FastRLGRPOTrainer`, a drop-in `trl.GRPOTrainer` (needs trl).

    from fastrl.integrations.trl import FastRLGRPOTrainer
    trainer = FastRLGRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(...), train_dataset=data)

or, for a trainer already built, `use_fastrl(trainer)`. `FIELDS` says what happens to every `GRPOConfig`
field.
"""

from .head import add_fastrl_lm_head
from .options import FIELDS, check_args
from .trainer import FastRLGRPOTrainer, use_fastrl

__all__ = ["FIELDS", "FastRLGRPOTrainer", "add_fastrl_lm_head", "check_args", "use_fastrl"]
