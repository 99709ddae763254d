"""The trainer's one configuration object, its presets, and loading from YAML/JSON files and CLI flags.

Precedence: dataclass defaults < preset < config file < command-line flags.

`TrainConfig.loss` is the `fastrl.LossConfig` the update uses; its knobs are declared there only. Files,
flags and `config_to_dict` spell them flat (`eps_low: 0.28`, `--eps-low 0.28`), next to the trainer's own
fields. The loss's `temperature` and `max_completion_length` are the sampler's (`temperature`,
`max_completion_length` below): the loss must score the distribution the completions were drawn from.
"""

import dataclasses
import json
from dataclasses import dataclass, field

from fastrl.losses import LossConfig

ADVANTAGE_SCALES = ("std", "batch-std", "none")
ENGINES = ("auto", "hf", "vllm")
PACKING = ("auto", "on", "off")
SCHEDULES = ("constant", "cosine", "linear")


@dataclass(frozen=True)
class TrainConfig:
    # --- model and data ---
    model: str = "tiny"  # "tiny" (built in, random init) or a Hugging Face model id / local path
    tiny_hidden_size: int = 128  # width of the built-in tiny model
    tiny_layers: int = 2  # depth of the built-in tiny model
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
    top_p: float = 1.0  # nucleus sampling
    vllm_gpu_memory_utilization: float = 0.35  # vLLM's share of GPU memory when colocated
    # --- rewards and advantages ---
    rewards: tuple = ("accuracy:1.0", "format:0.1")  # "name:weight"; names from fastrl.trainer.rewards
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
    bf16: bool = True  # bf16 autocast (GPU only; CPU runs in float32)
    lr: float = 1e-3  # AdamW learning rate of the GRPO phase
    weight_decay: float = 0.0  # AdamW weight decay
    adam_beta2: float = 0.999  # AdamW second-moment decay
    max_grad_norm: float = 1.0  # gradient clipping (0 = off)
    lr_schedule: str = "constant"  # constant / cosine / linear decay after warm-up
    lr_warmup_steps: int = 0  # linear LR warm-up, in optimizer steps
    # --- run control ---
    output_dir: str = "runs/default"  # metrics.jsonl, checkpoints/ and tensorboard/ go here
    max_steps: int = 100  # optimizer steps
    save_steps: int = 0  # checkpoint every N optimizer steps (0 = only at the end)
    keep_checkpoints: int = 2  # complete checkpoints kept on disk
    resume: bool = False  # continue from the latest checkpoint in output_dir
    seed: int = 0  # seeds model init, data order and sampling
    log_entropy: bool = True  # log the policy entropy (one extra no-grad pass over the vocabulary)
    tensorboard: bool = False  # also write TensorBoard scalars (needs the tensorboard package)
    progress: bool = True  # tqdm progress bar
    num_threads: int = 0  # torch CPU threads (0 = torch's default)
    device: str = "auto"  # auto / cpu / cuda

    def __post_init__(self):
        if not isinstance(self.loss, LossConfig):
            raise TypeError(f"loss must be a fastrl.LossConfig, got {type(self.loss).__name__}")
        checks = [
            ("advantage_scale", ADVANTAGE_SCALES),
            ("engine", ENGINES),
            ("packing", PACKING),
            ("lr_schedule", SCHEDULES),
        ]
        for name, allowed in checks:
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        positive = ("prompts_per_step", "group_size", "max_completion_length", "max_tokens_per_microbatch")
        for name in positive + ("ppo_epochs", "minibatches", "max_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.prompts_per_step % self.minibatches:
            raise ValueError(
                f"prompts_per_step={self.prompts_per_step} must be divisible by minibatches={self.minibatches}"
            )
        if self.group_size < 2 and self.advantage_scale != "none":
            raise ValueError(f"group_size={self.group_size}: group-normalized advantages need at least 2")
        if not 0.0 <= self.warmup_sft_noise <= 1.0:
            raise ValueError(f"warmup_sft_noise must be in [0, 1], got {self.warmup_sft_noise}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        for spec in self.rewards:
            name, _, weight = str(spec).partition(":")
            try:
                float(weight or 1.0)
            except ValueError:
                raise ValueError(f"reward spec {spec!r} must be 'name' or 'name:weight'") from None
        for name in SAMPLER_KNOBS:
            given, ours, default = getattr(self.loss, name), getattr(self, name), _LOSS_DEFAULTS[name]
            if given not in (default, ours):
                raise ValueError(
                    f"loss.{name}={given!r} disagrees with {name}={ours!r}: the loss uses the sampler's value; "
                    f"set {name} instead"
                )
        object.__setattr__(
            self,
            "loss",
            dataclasses.replace(
                self.loss, temperature=self.temperature, max_completion_length=self.max_completion_length
            ),
        )

    @property
    def needs_old_logprobs(self) -> bool:
        """A rollout batch feeds several optimizer steps, so the ratio needs the pre-update log-probs."""
        return self.ppo_epochs * self.minibatches > 1


# LossConfig fields that are sampler settings of the trainer (declared above, copied into `loss`)
SAMPLER_KNOBS = ("temperature", "max_completion_length")
_LOSS_DEFAULTS = {f.name: f.default for f in dataclasses.fields(LossConfig)}
# the loss knobs a file or flag sets directly, in LossConfig's order
LOSS_KNOBS = tuple(name for name in _LOSS_DEFAULTS if name not in SAMPLER_KNOBS)


PRESETS = {
    # CPU, built-in model and task; learns visibly in a few minutes on 2 cores (docs/trainer.md).
    "tiny": dict(
        model="tiny",
        dataset="arithmetic:9",
        warmup_sft_steps=300,
        prompts_per_step=16,
        group_size=8,
        max_completion_length=12,
        rewards=("accuracy:1.0", "format:0.1"),
        lr=5e-4,
        max_steps=100,
        save_steps=25,
        max_tokens_per_microbatch=4096,
        num_threads=1,
        device="cpu",
        output_dir="runs/tiny",
    ),
    # GPU: a reasoning model on competition math with 32k-token completions and vLLM rollouts
    # (DeepScaleR's setup). The R1-distilled chat template opens the <think> block in the prompt, so the
    # completions never contain "<think>" and the format reward would be a constant: accuracy only.
    "math-32k": dict(
        model="deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
        dataset="agentica-org/DeepScaleR-Preview-Dataset",
        prompt_key="problem",
        answer_key="answer",
        prompt_template="{prompt}\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
        chat_template=True,
        engine="auto",
        prompts_per_step=32,
        group_size=8,
        max_prompt_length=1024,
        max_completion_length=32768,
        rewards=("accuracy:1.0",),
        overlong_buffer=4096,
        loss_agg="token-mean",
        eps_high=0.28,
        max_tokens_per_microbatch=65536,
        gradient_checkpointing=True,
        lr=1e-6,
        lr_warmup_steps=10,
        max_grad_norm=1.0,
        max_steps=500,
        save_steps=25,
        output_dir="runs/math-32k",
    ),
}


def _coerce(name: str, value, default):
    """Turn a string (CLI / loose YAML) into the type of the field's default."""
    if isinstance(default, tuple):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        return tuple(value)
    if not isinstance(value, str):
        return value
    if isinstance(default, bool):
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name} expects a boolean, got {value!r}")
    if default is None:  # optional floats
        return None if value.lower() in ("none", "null", "") else float(value)
    try:
        return type(default)(value)
    except ValueError:
        raise ValueError(f"{name} expects {type(default).__name__}, got {value!r}") from None


def make_config(preset: str | None = None, file: str | None = None, **overrides) -> TrainConfig:
    """Build a TrainConfig from a preset name, a YAML/JSON file and keyword overrides (later wins)."""
    values: dict = {}
    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
        values.update(PRESETS[preset])
    if file is not None:
        with open(file, encoding="utf-8") as f:
            if file.endswith((".yaml", ".yml")):
                import yaml

                loaded = yaml.safe_load(f) or {}
            else:
                loaded = json.load(f)
        if not isinstance(loaded, dict):
            raise ValueError(f"{file} must hold a mapping of config fields, got {type(loaded).__name__}")
        values.update({k.replace("-", "_"): v for k, v in loaded.items()})
    values.update(overrides)
    return _build(values)


def _build(values: dict) -> TrainConfig:
    """A TrainConfig from flat values: trainer fields, plus loss knobs (or `loss` as a mapping/LossConfig)."""
    values = dict(values)
    loss = values.pop("loss", None)
    base = loss if isinstance(loss, LossConfig) else None  # TrainConfig checks its sampler knobs
    loss = {} if base is not None else loss
    if loss is not None and not isinstance(loss, dict):
        raise ValueError(f"loss must be a mapping of loss knobs or a LossConfig, got {type(loss).__name__}")
    loss_values = {k.replace("-", "_"): v for k, v in (loss or {}).items()}
    loss_values.update({k: values.pop(k) for k in LOSS_KNOBS if k in values})
    trainer_defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.name != "loss"}
    unknown = sorted((set(values) - set(trainer_defaults)) | (set(loss_values) - set(LOSS_KNOBS)))
    if unknown:
        raise ValueError(f"unknown config field(s) {unknown}")
    trainer_values = {k: _coerce(k, v, trainer_defaults[k]) for k, v in values.items()}
    sampler = {k: trainer_values.get(k, trainer_defaults[k]) for k in SAMPLER_KNOBS}
    loss_values = {k: _coerce(k, v, _LOSS_DEFAULTS[k]) for k, v in loss_values.items()}
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
