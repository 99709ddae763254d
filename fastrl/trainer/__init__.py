"""A thin GRPO trainer on the fused loss: `fastrl train --preset tiny` (CPU) or `--preset math-32k` (GPU).

One module per stage (config, tasks, rollout/, rewards, scoring, advantages, batching, update,
distributed, checkpoint, metrics, tiny/), `build.py` and `stages.py` as the loop's steps, `trainer.py` the
loop; see docs/trainer.md. Names below load lazily, so importing `fastrl.trainer.rewards` does not pull
in transformers.
"""

import importlib

_EXPORTS = {
    "TrainConfig": "config",
    "PRESETS": "config",
    "make_config": "config",
    "train": "trainer",
    "group_advantages": "advantages",
    "plan_microbatches": "batching",
    "train_step": "update",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
