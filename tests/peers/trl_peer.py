"""Run TRL's own `GRPOTrainer` loss code on given tensors (TRL imported unmodified).

The trainer is built without a model: `_get_per_token_logps_and_entropies` returns the test's
log-probs, so `compute_loss` runs TRL's loss as it ships. The vLLM importance-sampling ratio is
computed by the block of `_generate_and_score_completions` that TRL ships, executed on the test's
tensors (the rest of that method generates completions and is not run).
"""

import inspect
import math
import textwrap
import types
from collections import defaultdict

import torch
from trl import GRPOConfig, GRPOTrainer

_IS_START = "if self.use_vllm and self.vllm_importance_sampling_correction:\n"
_IS_FIRST_LINE = "mask = completion_mask if tool_mask is None else completion_mask * tool_mask"
_IS_END = "# Compute the per-token log probabilities for the reference model"


def _is_block():
    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    start = src.index(_IS_START, src.index("old_per_token_logps = None"))
    if _IS_FIRST_LINE not in src[start : start + 300]:
        raise AssertionError("TRL's importance-sampling block changed: update tests/peers/trl_peer.py")
    end = src.index(_IS_END, start)
    return compile(textwrap.dedent(src[start:end]), "<trl importance sampling>", "exec")


class _Accelerator:
    """One process of `num_processes` (gather / reduce are this process's values)."""

    def __init__(self, num_processes):
        self.num_processes = num_processes
        self.sync_gradients = True
        self.is_main_process = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


def make_args(**fields) -> GRPOConfig:
    return GRPOConfig(output_dir="/tmp/fastrl-trl-parity", use_cpu=True, bf16=False, report_to=[], **fields)


def trainer_for(args, *, num_processes=1, ga=None):
    """A GRPOTrainer with the attributes `__init__` derives from `args`, and no model."""
    t = GRPOTrainer.__new__(GRPOTrainer)
    t.args = args
    t.accelerator = _Accelerator(num_processes)
    t.model = types.SimpleNamespace(training=True)
    t.current_gradient_accumulation_steps = args.gradient_accumulation_steps if ga is None else ga
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    t.loss_type = args.loss_type
    t.beta = args.beta
    t.epsilon_low = args.epsilon
    t.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    t.importance_sampling_level = args.importance_sampling_level
    t.off_policy_mask_threshold = args.off_policy_mask_threshold
    t.top_entropy_quantile = args.top_entropy_quantile
    t.max_completion_length = args.max_completion_length
    t.use_vllm = args.use_vllm
    t.vllm_importance_sampling_correction = args.vllm_importance_sampling_correction
    t.vllm_importance_sampling_mode = args.vllm_importance_sampling_mode
    t.vllm_importance_sampling_clip_min = args.vllm_importance_sampling_clip_min
    t.vllm_importance_sampling_clip_max = args.vllm_importance_sampling_clip_max
    t.entropy_coef = args.entropy_coef
    t.use_adaptive_entropy = args.use_adaptive_entropy
    t._entropy_bonus_enabled = t.entropy_coef != 0.0 or t.use_adaptive_entropy
    t.aux_loss_enabled = False
    return t


def is_ratio(trainer, old, sampling, mask):
    """TRL's `importance_sampling_ratio` for a generation batch."""
    ns = dict(self=trainer, completion_mask=mask, tool_mask=None, old_per_token_logps=old,
              sampling_per_token_logps=sampling, torch=torch, math=math)  # fmt: skip
    exec(_is_block(), ns)
    return ns["vllm_importance_sampling_ratio"]


def trl_loss(trainer, logp, entropy, mask, adv, *, old=None, ref=None, sampling=None, is_ratio=None, num_items=None):
    """TRL's `compute_loss` on one micro-batch; logp / entropy are the policy's (differentiable) outputs."""
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp, entropy, None)
    B, T = logp.shape
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": adv,
    }
    optional = dict(old_per_token_logps=old, ref_per_token_logps=ref, sampling_per_token_logps=sampling,
                    importance_sampling_ratio=is_ratio, num_items_in_batch=num_items)  # fmt: skip
    inputs.update({k: v for k, v in optional.items() if v is not None})
    return trainer.compute_loss(None, inputs)
