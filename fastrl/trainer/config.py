"""The trainer's one configuration object, built from its presets (`presets.py`), YAML/JSON files and CLI flags.

Precedence: dataclass defaults < preset < config file < command-line flags.

`TrainConfig.loss` is the `fastrl.LossConfig` the update uses; its knobs are declared there only. Files,
flags and `config_to_dict` spell them flat (`eps_low: 0.28`, `--eps-low 0.28`), next to the trainer's own
fields. The loss's `temperature`, `max_completion_length`, `top_k`, `top_p` and `min_p` are the sampler's (the
fields of the same names below): the loss must score the distribution the completions were drawn from. Files and
flags keep the samplers' spellings of off (`top_k: 0`, `--top-p 1.0`); past the config everything reads
`TrainConfig.sampler`, a `fastrl.losses.SamplerSettings` whose one spelling of off is None (the engines turn it
into their own numbers at their call: `SamplerSettings.engine_kwargs`).
"""

import dataclasses
import typing
from dataclasses import dataclass, field

import torch

from fastrl.losses import LossConfig, SamplerSettings

from .eval_options import check_eval_options
from .presets import PRESETS, read_config_file
from .sequence_parallel import check_token_local
from .tasks import demonstrated
from .tool_options import check_tool_options, check_tool_world
from .trackers import parse_report_to
from .validate import ConfigError, check_fields, check_value, coerce

# Qwen3's sentence for a thinking span cut by the budget (the closing marker follows it)
STOP_THINKING = (
    "\n\nConsidering the limited time by the user, I have to give the solution based on the thinking directly now.\n"
)

__all__ = [
    "PRESETS",
    "ConfigError",
    "TrainConfig",
    "check_world",
    "config_fields",
    "config_to_dict",
    "make_config",
    "read_config_file",
]


@dataclass(frozen=True)
class TrainConfig:
    # --- model and data ---
    model: str = "tiny"  # "tiny" (built in, random init) or a Hugging Face model id / local path
    tiny_hidden_size: int = 128  # width of the built-in tiny model
    tiny_layers: int = 2  # depth of the built-in tiny model
    tiny_tokens: tuple = ()  # tokens of their own the built-in tiny tokenizer adds after its vocabulary (markup)
    dataset: str = "arithmetic:9"  # "arithmetic:<max operand>", a .jsonl file, or a HF dataset name
    dataset_split: str = "train"  # split of a HF dataset
    prompt_key: str = "prompt"  # JSONL / HF column holding the question
    answer_key: str = "answer"  # JSONL / HF column holding the gold answer
    prompt_template: str = "{prompt}"  # the user message; {prompt} is the question
    chat_template: bool = False  # wrap the prompt with the tokenizer's chat template
    # --- supervised warm-up (tiny preset: gives GRPO a partial skill to improve) ---
    warmup_sft_steps: int = 0  # supervised steps on noisy demonstrations before GRPO (0 = none)
    warmup_sft_noise: float = 0.75  # probability a demonstration's answer is a near miss
    warmup_sft_lr: float = 3e-3  # learning rate of the warm-up
    warmup_sft_batch_size: int = 64  # sequences per warm-up step
    # --- rollouts ---
    engine: str = "auto"  # "vllm" if installed and on GPU, else "hf" (transformers generate)
    prompts_per_step: int = 16  # prompts per rollout batch, over all ranks
    group_size: int = 8  # G: completions sampled per prompt
    max_prompt_length: int = 512  # prompts are left-truncated to this many tokens
    max_completion_length: int = 32  # new tokens per completion
    temperature: float = 1.0  # sampling temperature (the loss uses the same one)
    top_p: float = 1.0  # nucleus sampling (1 = off); the loss scores the truncated distribution
    top_k: int = 0  # top-k sampling (0 = off); the loss scores the truncated distribution
    min_p: float = 0.0  # min-p sampling (0 = off); the loss scores the truncated distribution
    sampler_replay: str = "auto"  # the loss replays the sets the sampler kept: auto (where the engine can), on, off
    vllm_gpu_memory_utilization: float = 0.35  # vLLM's share of GPU memory when colocated (on CPU: of host RAM)
    vllm_dtype: str = "auto"  # vLLM weights: auto (bf16 and a GPU: bfloat16, else float32), float32, bfloat16, float16
    vllm_kv_cache_gib: float = 0.0  # vLLM KV-cache size in GiB (0 = what vllm_gpu_memory_utilization leaves)
    vllm_sleep_level: int = 1  # vLLM sleeps in updates where it can (GPU): 1 offloads weights, 2 drops them, 0 never
    vllm_enforce_eager: bool = False  # vLLM without torch.compile / CUDA graphs: faster start, slower decoding
    # --- asynchronous rollouts (async_source.py, docs/math.md §10) ---
    async_staleness: int = -1  # K >= 0: vLLM rollouts in a process of their own, <= K versions stale (-1: off; not HF)
    rollout_chunk_tokens: int = 0  # with async_staleness: partial rollouts of at most N tokens per version (0 = off)
    rollout_timeout_s: float = 600.0  # with async_staleness: the rollout process's start-up and heartbeat limit
    rollout_gpus: str = ""  # with async_staleness on CUDA: the rollout process's GPU ids, e.g. "6,7" ("" = shared)
    # --- thinking budget and forced lengths (rollouts/thinking.py) ---
    thinking_budget: int = 0  # thinking tokens before the engine closes the span (0 = off); inserted tokens are masked
    think_start: str = "<think>"  # opens the thinking span (in the prompt or in the completion)
    think_end: str = "</think>"  # closes it
    thinking_stop_text: str = STOP_THINKING  # inserted before think_end when the budget runs out
    min_completion_length: int = 0  # no end token before this many tokens (forces long rollouts, for tests)
    # --- tools inside the chain of thought (tool_options.py, rollout/tool_turns.py; docs/trainer.md "Tools") ---
    tools: str = ""  # comma list of python (the sandboxed interpreter) and / or module:function ("" = off)
    max_tool_calls: int = 4  # tool calls per completion; later calls are not run (0: never run)
    tool_format: str = "code"  # code: ```python blocks and ```output observations; hermes: chat template, <tool_call>
    tool_timeout_s: float = 10.0  # wall-clock limit of one python call (its CPU-time limit too)
    tool_memory_mb: int = 1024  # address-space limit of one python call
    # --- rewards and advantages ---
    rewards: tuple = ("accuracy:1.0", "format:0.1")  # "name:weight" (accuracy, format) or "module:function:weight"
    length_penalty: float = 0.0  # weight of the Kimi k1.5 length penalty (0 = off)
    overlong_buffer: int = 0  # DAPO soft overlong penalty over the last N tokens (0 = off)
    mask_truncated: bool = False  # drop completions that hit max_completion_length from the loss
    advantage_scale: str = "std"  # "std" (GRPO), "batch-std", or "none" (Dr. GRPO)
    filter_zero_std: bool = False  # drop groups whose rewards are all equal (no signal)
    # --- loss ---
    loss: LossConfig = field(default_factory=LossConfig)  # policy-loss knobs; flat flags: --loss-agg, --eps-low, ...
    impl: str = "auto"  # log-prob kernel: auto / triton / torch
    # --- update ---
    ppo_epochs: int = 1  # passes over each rollout batch
    minibatches: int = 1  # optimizer steps per pass; ppo_epochs * minibatches > 1 needs old log-probs
    max_tokens_per_microbatch: int = 8192  # token budget of one forward/backward (padding included)
    packing: str = "auto"  # padding-free packing via position_ids: auto = when the model supports it
    gradient_checkpointing: bool = False  # recompute activations in backward
    fsdp: bool = False  # FSDP2: shard parameters, gradients and AdamW state over the torchrun ranks
    sequence_parallel: int = 1  # N ranks split each micro-batch's tokens (Ulysses attention); N divides the ranks
    bf16: bool = True  # bf16 autocast (GPU only; CPU runs in float32)
    lr: float = 1e-3  # AdamW learning rate of the GRPO phase
    weight_decay: float = 0.0  # AdamW weight decay
    adam_beta2: float = 0.999  # AdamW second-moment decay
    max_grad_norm: float = 1.0  # gradient clipping (0 = off)
    lr_schedule: str = "constant"  # constant / cosine / linear decay after warm-up
    lr_warmup_steps: int = 0  # linear LR warm-up, in optimizer steps
    # --- evaluation during training (eval_options.py; docs/trainer.md) ---
    eval_dataset: str = ""  # eval sets, comma-separated [name=]source: as dataset, or arithmetic-heldout:<N> / -trained
    eval_dataset_split: str = "test"  # split of a HF eval dataset
    eval_every: int = 0  # evaluate every N optimizer steps and after the last one (0 = off)
    eval_before_train: bool = False  # also evaluate the starting policy (a step-0 row)
    eval_samples: int = 1  # k: completions per eval problem (pass@k and maj@k for k = 1, 2, 4, ... <= k)
    eval_temperature: float | None = None  # 0 = greedy (None: greedy at eval_samples 1, else temperature)
    eval_max_problems: int = 0  # evaluate the first N problems of each eval set (0 = all)
    # --- run control ---
    output_dir: str = "runs/default"  # metrics.jsonl, checkpoints/ and tensorboard/ go here
    max_steps: int = 100  # optimizer steps
    save_steps: int = 0  # checkpoint every N optimizer steps (0 = only at the end)
    keep_checkpoints: int = 2  # complete checkpoints kept on disk
    resume: bool = False  # continue from the latest checkpoint in output_dir
    overwrite: bool = False  # delete the checkpoints and metrics of an earlier run in output_dir, then start
    seed: int = 0  # seeds model init, data order and sampling
    log_entropy: bool = True  # log the policy entropy (one extra no-grad pass over the vocabulary)
    report_to: str = "none"  # trackers each metrics.jsonl row also goes to: a comma list of tensorboard, wandb, mlflow
    tensorboard: bool = False  # adds tensorboard to report_to (writes <output_dir>/tensorboard)
    run_name: str = ""  # the W&B / MLflow run's name ("" = the tracker picks one)
    project: str = ""  # the W&B project / MLflow experiment ("" = fastrl)
    plot: bool = False  # draw <output_dir>/curves.png from metrics.jsonl at the end of the run (tiny preset: on)
    progress: bool = True  # tqdm progress bar
    log_every: int = 10  # without the progress bar: print one line of metrics every N steps (0 = never)
    num_threads: int = 0  # torch CPU threads (0 = torch's default)
    device: str = "auto"  # auto / cpu / cuda / cuda:<index>

    def __post_init__(self):
        if not isinstance(self.loss, LossConfig):
            raise TypeError(f"loss must be a fastrl.LossConfig, got {type(self.loss).__name__}")
        check_fields(self)  # each value alone: type, range, choices (validate.RULES)
        if self.prompts_per_step % self.minibatches:
            raise ConfigError("minibatches", self.minibatches, f"must divide prompts_per_step={self.prompts_per_step}")
        if self.group_size < 2 and self.advantage_scale != "none":
            raise ConfigError(
                "group_size", self.group_size, "group-normalized advantages need at least 2 (or advantage_scale=none)"
            )
        if self.warmup_sft_steps and not demonstrated(self.dataset):
            raise ConfigError(
                "dataset", self.dataset, f"the supervised warm-up (warmup_sft_steps={self.warmup_sft_steps}) needs a "
                "built-in task (arithmetic:<N>, products:<digits>): set --warmup-sft-steps 0",
            )  # fmt: skip
        _check_thinking(self)
        if self.sequence_parallel > 1:
            try:
                check_token_local(self.loss)
            except ValueError as e:
                raise ConfigError("sequence_parallel", self.sequence_parallel, str(e)) from None
        _check_async(self)
        check_eval_options(self)
        check_tool_options(self)
        if self.sampler_replay == "on" and (reason := replay_blocker(self)) is not None:
            raise ConfigError("sampler_replay", "on", reason)
        if self.resume and self.overwrite:
            raise ConfigError("overwrite", True, "--resume continues the run in output_dir; --overwrite deletes it")
        # the loss scores the sampler's distribution: a loss given its own sampler settings must agree (off in any
        # spelling agrees with off)
        given, ours = self.loss.sampler, self.sampler
        for name in SAMPLER_FIELDS:
            if getattr(given, name) not in (getattr(_LOSS_SAMPLER, name), getattr(ours, name)):
                raise ValueError(f"loss.{name}={getattr(self.loss, name)!r} disagrees with {name}="
                                 f"{getattr(self, name)!r}: the loss uses the sampler's value; "
                                 f"set {name} instead")  # fmt: skip
        if self.loss.max_completion_length not in (None, self.max_completion_length):
            raise ValueError(f"loss.max_completion_length={self.loss.max_completion_length!r} disagrees with "
                             f"max_completion_length={self.max_completion_length!r}: the loss uses the sampler's "
                             "value; set max_completion_length instead")  # fmt: skip
        loss = dataclasses.replace(self.loss, max_completion_length=self.max_completion_length, **self.sampler_values())
        object.__setattr__(self, "loss", loss)

    @property
    def sampler(self) -> SamplerSettings:
        """The sampler's settings from `temperature`, `top_k`, `top_p`, `min_p` (checked; None where off)."""
        return SamplerSettings(self.temperature, self.top_k, self.top_p, self.min_p)

    def sampler_values(self) -> dict:
        """`SAMPLER_FIELDS` by name as `SamplerSettings` stores them (None where off): what the loss is given."""
        settings = self.sampler
        return {name: getattr(settings, name) for name in SAMPLER_FIELDS}

    @property
    def trackers(self) -> tuple[str, ...]:
        """The trackers of `report_to`, and TensorBoard when `tensorboard` (its older spelling) is on."""
        names = parse_report_to(self.report_to)
        return names + ("tensorboard",) if self.tensorboard and "tensorboard" not in names else names

    @property
    def needs_old_logprobs(self) -> bool:
        """A rollout batch feeds several optimizer steps, so the ratio needs the pre-update log-probs."""
        return self.ppo_epochs * self.minibatches > 1


def _check_async(c: TrainConfig) -> None:
    """Asynchronous rollouts: the vLLM engine, K = 0 or at least the optimizer steps of one batch; the rollout
    process's own GPUs (`rollout_gpus`) only with it, on CUDA."""
    if c.rollout_gpus:
        from .rollout.devices import parse_gpu_ids

        try:
            parse_gpu_ids(c.rollout_gpus)
        except ValueError as e:
            raise ConfigError("rollout_gpus", c.rollout_gpus, str(e)) from None
        device = c.device if c.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
        if not device.startswith("cuda"):
            raise ConfigError("rollout_gpus", c.rollout_gpus, f"places the rollout process on GPUs: it needs a CUDA "
                              f"trainer, and device={c.device!r} runs on {device}")  # fmt: skip
    if c.async_staleness < 0:
        for name in ("rollout_chunk_tokens", "rollout_gpus"):
            if getattr(c, name):
                raise ConfigError(name, getattr(c, name), "needs async_staleness >= 0 (a rollout process of its own)")
        return
    if c.engine != "vllm":
        raise ConfigError("async_staleness", c.async_staleness, f"needs engine='vllm' (the {c.engine!r} engine is "
                          "synchronous: use async_staleness=-1)")  # fmt: skip
    steps = c.ppo_epochs * c.minibatches
    if 0 < c.async_staleness < steps:
        raise ConfigError("async_staleness", c.async_staleness, f"counts optimizer steps: with ppo_epochs="
                          f"{c.ppo_epochs} x minibatches={c.minibatches} = {steps} steps per batch, the groups "
                          f"sampled under a batch's first version are {steps} versions old at the next and always "
                          f"dropped; use async_staleness=0 or >= {steps}")  # fmt: skip


def check_world(c: TrainConfig, world: int) -> None:
    """What the config asks of a launch of `world` ranks, checked at start-up on every rank."""
    if c.fsdp and world < 2:
        raise ConfigError("fsdp", True, f"shards over the ranks of a torchrun launch; this run has {world} "
                          "(use torchrun)")  # fmt: skip
    if world % c.sequence_parallel:
        raise ConfigError("sequence_parallel", c.sequence_parallel, f"must divide the world size {world} (each "
                          "sequence group is one data-parallel replica)")  # fmt: skip
    check_tool_world(c, world)


def replay_blocker(c: TrainConfig) -> str | None:
    """Why the config alone rules out replaying the sampler's kept sets (docs/math.md §9); None: an engine that
    records them may."""
    if not c.sampler.truncates:
        return "nothing is truncated (top_k, top_p and min_p are off): there is no kept set to replay"
    return None


def _check_thinking(c: TrainConfig) -> None:
    """The thinking budget and the forced length against max_completion_length."""
    room = f"max_completion_length={c.max_completion_length}"
    if c.min_completion_length > c.max_completion_length:
        raise ConfigError("min_completion_length", c.min_completion_length, f"must be <= {room}")
    if c.thinking_budget and c.thinking_budget >= c.max_completion_length:
        raise ConfigError("thinking_budget", c.thinking_budget, f"must leave room for an answer within {room}")
    for name in ("think_start", "think_end"):
        if c.thinking_budget and not getattr(c, name):
            raise ConfigError(name, getattr(c, name), "a thinking budget needs both markers")


# the sampler settings the trainer declares (above) and gives the loss; the soft-cap is the model's, a loss knob
SAMPLER_FIELDS = tuple(f.name for f in dataclasses.fields(SamplerSettings) if f.name != "softcap")
_LOSS_DEFAULTS = {f.name: f.default for f in dataclasses.fields(LossConfig)}
_LOSS_SAMPLER = LossConfig().sampler
# the loss knobs a file or flag sets directly, in LossConfig's order (the sampler's and its length are the trainer's)
LOSS_KNOBS = tuple(name for name in _LOSS_DEFAULTS if name not in (*SAMPLER_FIELDS, "max_completion_length"))


def make_config(preset: str | None = None, file: str | None = None, **overrides) -> TrainConfig:
    """Build a TrainConfig from a preset name, a YAML/JSON file and keyword overrides (later wins).

    Raises ConfigError (a ValueError) naming the field and the value, or the file.
    """
    values: dict = {}
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError("preset", preset, f"must be one of {', '.join(sorted(PRESETS))}")
        values.update(PRESETS[preset])
    if file is not None:
        loaded = read_config_file(file)
        unknown = sorted(set(loaded) - set(config_fields()) - {"loss"})
        if unknown:
            raise ConfigError(unknown[0], loaded[unknown[0]], f"is not a config field (in {file})")
        values.update(loaded)
    values.update(overrides)
    return _build(values)


def _build(values: dict) -> TrainConfig:
    """A TrainConfig from flat values: trainer fields, plus loss knobs (or `loss` as a mapping/LossConfig)."""
    values = dict(values)
    loss = values.pop("loss", None)
    base = loss if isinstance(loss, LossConfig) else None  # TrainConfig checks its sampler knobs
    loss = {} if base is not None else loss
    if loss is not None and not isinstance(loss, dict):
        raise ConfigError("loss", loss, "must be a mapping of loss knobs or a LossConfig")
    loss_values = {k.replace("-", "_"): v for k, v in (loss or {}).items()}
    loss_values.update({k: values.pop(k) for k in LOSS_KNOBS if k in values})
    hints = typing.get_type_hints(TrainConfig)
    unknown = sorted((set(values) - set(hints) - {"loss"}) | (set(loss_values) - set(LOSS_KNOBS)))
    if unknown:
        raise ConfigError(unknown[0], {**values, **loss_values}[unknown[0]], "is not a config field")
    trainer_values = {k: coerce(k, v, hints[k]) for k, v in values.items()}
    for name, value in trainer_values.items():
        check_value(name, value, hints[name])
    loss_hints = typing.get_type_hints(LossConfig)
    loss_values = {k: coerce(k, v, loss_hints[k]) for k, v in loss_values.items()}
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.name != "loss"}
    sampler = {k: trainer_values.get(k, defaults[k]) for k in (*SAMPLER_FIELDS, "max_completion_length")}
    # each loss knob alone first, so an error names the knob that is wrong
    for name, value in loss_values.items():
        try:
            LossConfig(**{**sampler, name: value})
        except (TypeError, ValueError) as e:
            raise ConfigError(name, value, str(e)) from None
    if base is not None:
        return TrainConfig(**trainer_values, loss=dataclasses.replace(base, **loss_values))
    return TrainConfig(**trainer_values, loss=LossConfig(**loss_values, **sampler))


def config_fields() -> dict:
    """Every flat config key and its default, in the order `config_to_dict` writes them."""
    out = {}
    for f in dataclasses.fields(TrainConfig):
        if f.name == "loss":
            out.update({k: _LOSS_DEFAULTS[k] for k in LOSS_KNOBS})
        else:
            out[f.name] = f.default
    return out


def config_to_dict(config: TrainConfig) -> dict:
    """The flat form of a config (the keys files and flags use): loss knobs sit among the trainer's fields."""
    out = {}
    for f in dataclasses.fields(TrainConfig):
        if f.name == "loss":
            out.update({k: getattr(config.loss, k) for k in LOSS_KNOBS})
        else:
            out[f.name] = getattr(config, f.name)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}
