"""What every rollout engine is built from: `(model, tokenizer, config)`, read the same way by each."""

import sys

from ..config import replay_blocker
from ..validate import ConfigError
from .interface import end_token_ids
from .thinking import thinking_budget_of
from .tool_turns import tool_turns_of

__all__ = ["SamplingEngine", "resolve_replay"]


class SamplingEngine:
    """The sampler settings both engines take from a `TrainConfig`: lengths, temperature, top-p / top-k / min-p,
    end tokens, the thinking budget and the tools (ConfigError when the budget cannot fit, before an engine starts)."""

    def __init__(self, model, tokenizer, config):
        self.tokenizer = tokenizer
        self.max_new_tokens, self.min_new_tokens = config.max_completion_length, config.min_completion_length
        self.sampler = config.sampler  # temperature, top-k, top-p, min-p; None where off
        self.eos_ids = end_token_ids(model, tokenizer)  # the tokenizer's EOS and the model's end-of-turn tokens
        self.thinking = thinking_budget_of(config, tokenizer)
        self.tools = tool_turns_of(config, tokenizer)  # multi-turn tool rollouts (`tool_turns.py`); None when off
        self.replay = False  # whether each completion carries its tokens' kept sets (`resolve_replay`)


def resolve_replay(config, engine_blocker: str | None) -> bool:
    """Whether the engine records the sampler's kept sets for the loss to replay (`--sampler-replay`).

    `engine_blocker`: why this engine cannot record them (None: it can). "off": never. "on": always, or a
    ConfigError naming the reason. "auto": when nothing stands in the way; else the loss finds the sets again from
    its own logits (docs/math.md §8), said once on stderr (silently when nothing is truncated).
    """
    if config.sampler_replay == "off":
        return False
    reason = replay_blocker(config) or engine_blocker
    if reason is None:
        return True
    if config.sampler_replay == "on":
        raise ConfigError("sampler_replay", "on", reason)
    if config.sampler.truncates:
        print(f"fastrl: sampler_replay=auto: not replaying the sampler's kept sets ({reason}); the loss finds them "
              "again from its own logits", file=sys.stderr, flush=True)  # fmt: skip
    return False
