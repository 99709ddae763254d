"""Building a run: device and process group, model and tokenizer, data, warm-up, reference model,
optimizer and schedule, and what a checkpoint restores. `start_run` does it all in the order the seeds
expect, so a run is reproducible from `config.seed` alone.
"""

import copy
import math
import os
import random
import sys
from dataclasses import dataclass

import torch

from fastrl.hf import enable_checkpointing

from . import distributed as dist_utils
from .checkpoint import latest_checkpoint, list_checkpoints, resume_checkpoint
from .config import TrainConfig, check_world
from .fsdp import shard_model
from .rollout.devices import RankPlacement, check_rank_uuids, place_rank, visible_gpu_ids
from .sequence_parallel import SequenceParallel, init_sequence_parallel
from .sharded_checkpoint import is_sharded_checkpoint, load_sharded
from .tasks import PromptStream, load_problems
from .tiny import built_in, tiny_model, tiny_tokenizer
from .ulysses import check_heads
from .update import StepSettings, supports_packing
from .validate import ConfigError
from .warmup import sft_warmup

FUSED_ADAMW_DEVICES = ("cpu", "cuda")


def make_adamw(params, lr: float, weight_decay: float = 0.0, betas=(0.9, 0.999)) -> torch.optim.AdamW:
    """The run's AdamW: torch's fused kernel when every parameter lives where it has one (CPU, CUDA).

    The fused form updates each parameter in one pass; the per-parameter loop holds two temporaries of the
    largest parameter's size (2 × V × D for the embedding), and the multi-tensor form one of the whole model.
    HF's Trainer defaults to the same fused kernel (`adamw_torch_fused`).
    """
    params = list(params)
    fused = bool(params) and all(p.device.type in FUSED_ADAMW_DEVICES and p.is_floating_point() for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas, fused=fused or None)


@dataclass
class Run:
    """What the loop carries from step to step."""

    model: torch.nn.Module
    tokenizer: object
    ref_model: torch.nn.Module | None  # frozen policy of the start (beta > 0), else None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    stream: PromptStream
    packed: bool  # padding-free packed micro-batches
    rank: int
    own_group: bool  # this process created the process group (and destroys it at the end)
    settings: StepSettings  # how `update.train_step` and `update.sequence_logprobs` run
    sp: SequenceParallel  # data-parallel x sequence-parallel: prompts, seeds and counts follow sp.dp_rank
    resumed: bool = False
    step: int = 0  # optimizer steps taken
    elapsed_before: float = 0.0  # training seconds of the runs this one resumes
    async_state: dict | None = None  # an asynchronous run's prompt ledger (`PromptLedger.state_dict`)


def resolve_device(config: TrainConfig) -> tuple[torch.device, RankPlacement | None]:
    """This rank's device, and on plain `cuda` the placement it came from: the local rank's GPU, or with
    `rollout_gpus` one of the launcher's other GPUs (`rollout.devices.place_rank`)."""
    name = config.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name != "cuda":
        return torch.device(name), None
    visible = visible_gpu_ids(os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count())
    placement = place_rank(int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                           visible, config.rollout_gpus, config.async_staleness)  # fmt: skip
    return torch.device("cuda", placement.device), placement


def check_rank_gpus(placement: RankPlacement) -> None:
    """Refuse, on every rank, a trainer rank on a rollout GPU or on another rank's GPU, compared by UUID.

    Each rank reads its own GPU's UUID and its node's rollout GPUs'; rank 0's node starts the rollout process, so
    its rollout UUIDs are the ones checked.
    """
    mine = (dist_utils.gpu_uuid(placement.device), [dist_utils.gpu_uuid(i) for i in placement.rollout])
    everyone = dist_utils.gather_objects(mine)
    check_rank_uuids([uuid for uuid, _ in everyone], everyone[0][1])


def build_model(config: TrainConfig, device: torch.device):
    """(model, tokenizer): the built-in tiny pair, or a Hugging Face causal LM and its tokenizer."""
    if built_in(config.model):
        tokenizer = tiny_tokenizer(config)
        max_len = config.max_prompt_length + config.max_completion_length
        model = tiny_model(
            len(tokenizer), config.tiny_hidden_size, config.tiny_layers, max_len=max_len, seed=config.seed
        )
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(config.model)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        attn = "sdpa"
        if device.type == "cuda":
            try:
                import flash_attn  # noqa: F401

                attn = "flash_attention_2"  # varlen kernels: padding-free packing
            except ImportError:
                pass
        model = AutoModelForCausalLM.from_pretrained(config.model, dtype=torch.float32, attn_implementation=attn)
    model.to(device)
    if config.gradient_checkpointing:
        enable_checkpointing(model)
    return model, tokenizer


def make_scheduler(optimizer, config: TrainConfig):
    """Linear warm-up over `lr_warmup_steps`, then constant, cosine or linear decay to `max_steps`."""
    warm, total = config.lr_warmup_steps, config.max_steps

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        frac = (step - warm) / max(1, total - warm)
        if config.lr_schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        if config.lr_schedule == "linear":
            return max(0.0, 1 - frac)
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def start_run(config: TrainConfig) -> Run:
    """Everything before the first rollout; resumes from the latest checkpoint when `config.resume`."""
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    device, placement = resolve_device(config)
    own_group = dist_utils.init_from_env(device)
    if placement is not None:  # no rank on a rollout GPU or on another rank's, by UUID across the ranks
        check_rank_gpus(placement)
    rank = dist_utils.rank()
    sp = _split_the_world(config)
    problems = _load_data(config)  # the data before the model: a dataset that does not load costs no download
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    model, tokenizer = build_model(config, device)
    # Ulysses attention splits packed rows at their documents whatever the model's own attention
    packed = config.packing == "on" or (config.packing == "auto" and (supports_packing(model) or sp.size > 1))
    if sp.size > 1:
        heads = model.config.num_attention_heads
        check_heads(heads, getattr(model.config, "num_key_value_heads", None) or heads, sp.size)
    resuming = _resuming(config)
    if config.warmup_sft_steps and not resuming:
        loss = sft_warmup(model, tokenizer, problems, config, packed, progress=config.progress and rank == 0)
        if not config.progress and config.log_every and rank == 0:
            print(f"sft warm-up: {config.warmup_sft_steps} steps, last loss {loss:.4f}", file=sys.stderr, flush=True)
    model, ref_model = _policy_and_reference(model, config, device)
    optimizer = make_adamw(model.parameters(), config.lr, config.weight_decay, (0.9, config.adam_beta2))
    settings = StepSettings.from_config(config, packed, tokenizer.pad_token_id, sp if sp.size > 1 else None)
    run = Run(model, tokenizer, ref_model, optimizer, make_scheduler(optimizer, config),
              PromptStream(problems, config.seed), packed, rank, own_group, settings, sp)  # fmt: skip
    if not (resuming and _restore(run, config)):
        # replicas sample differently; the ranks of a sequence group alike (they split the same rollouts)
        torch.manual_seed(config.seed * 7919 + sp.dp_rank)
    return run


def _split_the_world(config: TrainConfig) -> SequenceParallel:
    """The sequence-parallel groups, once the prompts of a step split evenly over the data-parallel replicas."""
    world = dist_utils.world_size()
    check_world(config, world)
    sp = init_sequence_parallel(config.sequence_parallel)  # a sequence group is one data-parallel replica
    if (config.prompts_per_step // sp.dp_size) % config.minibatches or config.prompts_per_step % sp.dp_size:
        raise ValueError(
            f"prompts_per_step={config.prompts_per_step} must split evenly over {sp.dp_size} data-parallel "
            f"replicas ({world} ranks / sequence_parallel={sp.size}) and then into minibatches={config.minibatches}"
        )
    return sp


def _load_data(config: TrainConfig) -> list:
    try:
        return load_problems(
            config.dataset,
            config.seed,
            split=config.dataset_split,
            prompt_key=config.prompt_key,
            answer_key=config.answer_key,
        )
    except (OSError, ValueError) as e:  # a missing key or column, an unknown HF dataset, no network
        raise ConfigError("dataset", config.dataset, f"cannot be loaded: {str(e).splitlines()[0]}") from e


def _resuming(config: TrainConfig) -> bool:
    """Whether the run resumes; a checkpoint must be resumed the way it was written (sharded or not)."""
    resuming = config.resume and bool(list_checkpoints(config.output_dir))
    if resuming and is_sharded_checkpoint(latest_checkpoint(config.output_dir)) != config.fsdp:
        kind = "without" if config.fsdp else "with"
        raise ValueError(
            f"{latest_checkpoint(config.output_dir)} was written {kind} --fsdp: resume it the way it was written"
        )
    return resuming


def _policy_and_reference(model, config: TrainConfig, device: torch.device):
    """The policy and the frozen reference (None without a KL term), each sharded under --fsdp."""
    ref_model = None
    if config.loss.beta > 0:  # the policy as GRPO starts (after any warm-up); frozen
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    if config.fsdp:  # every rank built the same weights; each keeps its shard of them
        param_dtype = torch.bfloat16 if config.bf16 and device.type == "cuda" else None
        model = shard_model(model, param_dtype=param_dtype)
        ref_model = None if ref_model is None else shard_model(ref_model, param_dtype=param_dtype)
    return model, ref_model


def _restore(run: Run, config: TrainConfig) -> bool:
    """Load the latest checkpoint into `run` (weights, optimizer, scheduler, step, data position); False if none."""
    if config.fsdp:
        state = load_sharded(
            latest_checkpoint(config.output_dir), run.model, run.optimizer, run.scheduler, run.ref_model
        )
    else:
        _, state = resume_checkpoint(config.output_dir, run.model, run.optimizer, run.scheduler)
    if state is None:
        return False
    run.resumed, run.step, run.stream.position = True, state["step"], state["data_position"]
    run.elapsed_before = state.get("elapsed_s", 0.0)
    run.async_state = state.get("async_state")
    if run.ref_model is not None and "ref_model" in state:  # replicated runs (sharded ones restored it above)
        run.ref_model.load_state_dict(state["ref_model"])
    return True
