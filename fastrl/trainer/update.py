"""The update: one optimizer step of the fused GRPO loss over token-budgeted micro-batches.

The loss of the whole step is the sum of the micro-batch losses because every micro-batch divides by the
GLOBAL normalizer (tokens for token-mean, sequences otherwise), summed over micro-batches and ranks. The
gradient is then exact: each rank backpropagates its share and the gradients are SUM-all-reduced (or, with
`--fsdp`, SUM-reduce-scattered into the shards; the model's calls then run through `fsdp.run_sharded`).
Under sequence parallelism without `--fsdp`, the head's gradient is summed over the sequence group as soon
as the loss forms it, each rank keeping its rows (`sequence_parallel.HeadGradientRows`).

Each `*MLP` module of an unsharded model runs in token tiles (`tiled_mlp.py`): a long micro-batch then holds
one tile's MLP activations at a time, not the whole sequence's, while a layer is recomputed under gradient
checkpointing. The LM body runs on the (packed or padded) micro-batch; the hidden states that predict completion tokens
are gathered into `[n_seq, max_completion, D]` and handed with the head's weight (`fastrl.lm_body_and_head`)
to `fastrl.grpo_loss`, which never builds the `[tokens, V]` logits (docs/math.md §1-3). A tied embedding is
the same Parameter as the head's weight, so autograd sums both of its gradients.

With `StepSettings.sequence` (`--sequence-parallel N`) each rank runs its block of every micro-batch
(`sequence_parallel.split_microbatch`) under Ulysses attention (`ulysses.py`), forward and backward, and the
normalizer is counted over the blocks of the sequence group; the rest of the step is the same.

Samples that carry the sampler's kept sets (`Sample.kept`, `--sampler-replay`) are scored on them (docs/math.md
§9): the loss, the old / reference log-probs and so the ratios use the set the sampler kept, never a set found
again from the trainer's logits; a token whose target is not in its set is left out of the loss and counted
(`replay_missing_tokens`). Under sequence parallelism each rank's block carries its tokens' sets.
"""

import dataclasses
import math
from contextlib import nullcontext

import torch

from fastrl.hf import hidden_and_head, lm_body_and_head, tile_mlps
from fastrl.kernels import sampled_token_logprobs, token_logprobs
from fastrl.losses import METRIC_KEYS, LossConfig, grpo_loss

from . import distributed as dist_utils
from .batching import Sample, collate, plan_microbatches
from .fsdp import filler_sample, is_sharded, run_sharded
from .sequence_parallel import (
    HeadGradientRows,
    SequenceParallel,
    check_token_local,
    gather_rows,
    init_sequence_parallel,
    split_microbatch,
    step_normalizer,
)
from .ulysses import ulysses


@dataclasses.dataclass(frozen=True)
class StepSettings:
    """How the update runs: everything `train_step` and `sequence_logprobs` take besides the model and the data."""

    loss: LossConfig  # the policy loss; its temperature and sampler knobs also score `sequence_logprobs`
    budget: int  # tokens per micro-batch (max_tokens_per_microbatch)
    packed: bool  # padding-free packed micro-batches, else padded rows
    pad_id: int  # the tokenizer's pad token
    max_grad_norm: float = 1.0  # gradient clipping; <= 0: off (the norm is still measured)
    impl: str = "auto"  # the fused loss's implementation: "auto", "triton" or "torch"
    bf16: bool = True  # bf16 autocast of the body on CUDA
    log_entropy: bool = True  # the entropy metric, from the loss's own pass over the vocabulary
    sequence: SequenceParallel | None = None  # this rank's sequence group: its block of every micro-batch

    def __post_init__(self):
        if not isinstance(self.loss, LossConfig):
            raise TypeError(f"loss must be a fastrl.LossConfig, got {type(self.loss).__name__}")
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 1:
            raise ValueError(f"budget must be a positive int (tokens per micro-batch), got {self.budget!r}")
        if self.sequence is not None and self.sequence.size > 1:
            check_token_local(self.loss)

    @classmethod
    def from_config(cls, config, packed: bool, pad_id: int, sequence: SequenceParallel | None = None) -> "StepSettings":
        """The settings of a `TrainConfig` run (`packed` and `pad_id` are the built model's and tokenizer's,
        `sequence` the run's groups)."""
        return cls(config.loss, config.max_tokens_per_microbatch, packed, pad_id, config.max_grad_norm, config.impl,
                   config.bf16, config.log_entropy, sequence)  # fmt: skip


def _check_settings(settings) -> None:
    if not isinstance(settings, StepSettings):
        raise TypeError(f"settings must be a StepSettings, got {type(settings).__name__}")


def supports_packing(model) -> bool:
    """Whether the model's attention splits a packed row at position_ids that restart at 0.

    transformers' mask builders do this for sdpa / eager / flash attention when no attention_mask is
    passed (`masking_utils.find_packed_sequence_indices`); older versions only under flash attention.
    """
    impl = getattr(model.config, "_attn_implementation", None) or ""
    if impl.startswith("flash_attention"):
        return True
    try:
        from transformers import masking_utils
    except ImportError:
        return False
    return hasattr(masking_utils, "find_packed_sequence_indices") and impl in ("sdpa", "eager")


def _autocast(device: torch.device, bf16: bool):
    return torch.autocast("cuda", dtype=torch.bfloat16) if bf16 and device.type == "cuda" else nullcontext()


def completion_hidden(model, mb: dict, bf16: bool) -> torch.Tensor:
    """`[n_seq, max_completion, D]` hidden states predicting each completion token of the micro-batch."""
    device = next(model.parameters()).device
    with _autocast(device, bf16):
        hidden, _, _ = hidden_and_head(
            model,
            mb["input_ids"].to(device),
            attention_mask=None if mb["attention_mask"] is None else mb["attention_mask"].to(device),
            position_ids=mb["position_ids"].to(device),
            use_cache=False,
        )
    if bf16 and device.type == "cuda":
        # the final norm may come back in fp32 (fp32 weight * bf16 activations); the fused loss runs the
        # head matmul in bf16 like an autocast Linear would (its statistics stay fp32)
        hidden = hidden.to(torch.bfloat16)
    return hidden.reshape(-1, hidden.shape[-1])[mb["gather"].to(device)]


def head_params(model, dtype):
    """The LM head's weight and bias (`fastrl.lm_body_and_head`) in the hidden states' dtype."""
    _, weight, bias = lm_body_and_head(model)
    # under autocast the body emits bf16; the kernel wants one dtype and accumulates in fp32 anyway
    return weight.to(dtype), None if bias is None else bias.to(dtype)


def _plan(model, samples: list[Sample], budget: int, packed: bool, filler: Sample) -> list[list[Sample]]:
    """This rank's micro-batches; a sharded model pads every rank to the same count with filler ones."""
    plan = [[samples[i] for i in idx] for idx in plan_microbatches([len(s) for s in samples], budget, packed)]
    if is_sharded(model):
        plan += [[filler]] * (int(dist_utils.all_reduce_max(float(len(plan)))) - len(plan))
    return plan


def sampler_options(loss_config: LossConfig) -> dict:
    """The sampler's truncation as `token_logprobs` keywords (docs/math.md §8)."""
    return {k: getattr(loss_config, k) for k in ("top_k", "top_p", "min_p", "softcap")}


def replay_options(mb: dict, device) -> dict:
    """The micro-batch's kept sets as keywords of the loss / log-prob call, with the θ truncation off (the sets
    are the truncation); {} when it carries none."""
    if mb.get("kept_ids") is None:
        return {}
    return dict(kept_ids=mb["kept_ids"].to(device), kept_offsets=mb["kept_offsets"].to(device), top_k=0, top_p=1.0,
                min_p=0.0)  # fmt: skip


def _logprobs(model, mb: dict, bf16: bool, temperature: float, impl: str, sampler: dict | None) -> torch.Tensor:
    hidden = completion_hidden(model, mb, bf16)
    weight, bias = head_params(model, hidden.dtype)
    targets = mb["targets"].to(hidden.device)
    replay = replay_options(mb, hidden.device)
    if not replay:
        return token_logprobs(hidden, weight, targets, bias=bias, temperature=temperature, impl=impl, **(sampler or {}))
    # a position without a set (padding, an inserted token) is ignored; one whose target is not in its set gets
    # a finite log-prob (its mask is 0)
    targets = torch.where(replay["kept_offsets"].diff().view_as(targets) > 0, targets, -100)
    softcap = (sampler or {}).get("softcap")
    return sampled_token_logprobs(hidden, weight, targets, bias=bias, temperature=temperature, impl=impl,
                                  softcap=softcap, **replay).logp  # fmt: skip


@torch.no_grad()
def sequence_logprobs(model, samples: list[Sample], settings: StepSettings) -> list[list[float]]:
    """Log-probs of each sample's completion tokens under `model` (no grad, fused path, same budget), at the
    loss's temperature and sampler (docs/math.md §8, `settings.loss`); kept sets, where the samples carry them."""
    _check_settings(settings)
    s = settings
    args = (s.bf16, s.loss.temperature, s.impl, sampler_options(s.loss))
    rows: list[list[float]] = []
    with _sequence_parallel(model, s):
        for mb, seqs in _batches(model, samples, s, filler_sample(s.pad_id, ref=False, rollout=False)):
            logp = run_sharded(model, _logprobs, mb, *args)
            logp = (logp if s.sequence is None else gather_rows(logp, mb, s.sequence)).cpu()
            rows += [logp[row, : len(sample.completion_ids)].tolist() for row, sample in enumerate(seqs)]
    out: list[list[float]] = [[] for _ in samples]
    order = [i for idx in plan_microbatches([len(sample) for sample in samples], s.budget, s.packed) for i in idx]
    for i, lp in zip(order, rows):  # filler rows come last and are dropped
        out[i] = lp
    return out


def _batches(model, samples: list[Sample], s: StepSettings, filler: Sample):
    """(micro-batch, its samples) pairs of `_plan`, collated; under sequence parallelism, this rank's block."""
    for seqs in _plan(model, samples, s.budget, s.packed, filler):
        mb = collate(seqs, s.packed, s.pad_id)
        yield (mb if s.sequence is None else split_microbatch(mb, s.sequence)), seqs


def _sequence_parallel(model, s: StepSettings):
    """Ulysses attention around a whole pass (forward and backward) when the step is sequence-parallel."""
    return nullcontext() if s.sequence is None else ulysses(model, s.sequence)


def train_step(model, optimizer, samples: list[Sample], settings: StepSettings) -> dict:
    """One optimizer step on this rank's `samples` (a shard of the step's batch). Returns step metrics.

    The caller steps the LR scheduler. Every rank must call this, even with no samples (the collectives must match).

    Raises:
        TypeError: `settings` not a `StepSettings`.
    """
    _check_settings(settings)
    s = settings
    model.zero_grad(set_to_none=True)
    if not is_sharded(model):  # long micro-batches: the MLPs' activations about a thousand tokens at a time
        tile_mlps(model)
    sums = dict.fromkeys(("loss", "num_tokens", "replay_missing_tokens") + METRIC_KEYS, 0.0)
    filler = filler_sample(s.pad_id, ref=s.loss.beta > 0, rollout=s.loss.is_cap is not None)
    batches = list(_batches(model, samples, s, filler))
    # the collated masks: without a token the loss leaves out (a target missing from its kept set); under
    # sequence parallelism, counted over the blocks of the sequence group (this rank holds 1/N of each micro-batch)
    live = sum(1 for sample in samples if sample.loss_mask)
    sequence = s.sequence or init_sequence_parallel(1)
    normalizer = step_normalizer([mb for mb, _ in batches], s.loss.loss_agg, live, sequence)
    # under sequence parallelism each rank keeps its rows of the head's gradient, summed over the group
    split = s.sequence is not None and s.sequence.size > 1 and not is_sharded(model)  # FSDP shards it already
    head_rows = HeadGradientRows(s.sequence) if split else None
    with _sequence_parallel(model, s):
        for mb, _ in batches:
            out = run_sharded(model, _microbatch_loss, mb, s, normalizer)
            if head_rows is not None:
                head_rows.take(out.loss)
            out.loss.backward()
            n = float(out.metrics["num_tokens"])
            sums["loss"] += float(out.loss.detach())
            sums["num_tokens"] += n
            if mb.get("kept_missing") is not None:
                sums["replay_missing_tokens"] += float(mb["kept_missing"].sum())
            for k in METRIC_KEYS:
                if k in out.metrics:
                    sums[k] += float(out.metrics[k]) * n  # token-weighted; divided by the global count below
    params = [p for p in model.parameters() if p.requires_grad]
    if head_rows is not None:
        head_rows.add_to(lm_body_and_head(model)[1])
    if not is_sharded(model):  # FSDP has reduce-scattered (summed) them already
        dist_utils.all_reduce_grads(params)
    clip = s.max_grad_norm if s.max_grad_norm > 0 else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
    # nothing to learn from (every group filtered or masked), or a non-finite gradient: keep the weights
    skipped = not (normalizer > 0 and math.isfinite(grad_norm))
    if not skipped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {**_finalize_metrics(sums, grad_norm), "update_skipped": float(skipped)}


def _microbatch_loss(model, mb, s: StepSettings, normalizer: float):
    """The fused loss of one micro-batch; its metrics carry the entropy (same pass) when `s.log_entropy`."""
    hidden = completion_hidden(model, mb, s.bf16)
    weight, bias = head_params(model, hidden.dtype)
    dev = hidden.device
    opt = {k: None if mb[k] is None else mb[k].to(dev) for k in ("old_logprobs", "ref_logprobs", "rollout_logprobs")}
    if s.loss.is_cap is None:
        opt["rollout_logprobs"] = None
    opt.update(replay_options(mb, dev))  # with sets, grpo_loss takes its replay path
    # the entropy rides on the loss's own pass over the vocabulary (elementwise work on each tile); a
    # separate no-grad pass would cost one more [tokens, D] x [D, V] GEMM, a third of the head's work
    return grpo_loss(
        hidden,
        weight,
        mb["targets"].to(dev),
        mb["mask"].to(dev),
        mb["advantages"].to(dev),
        bias=bias,
        config=s.loss,
        normalizer=normalizer,
        impl=s.impl,
        return_entropy=s.log_entropy,
        **opt,
    )


def _finalize_metrics(sums: dict, grad_norm: float) -> dict:
    """All-reduce the step's sums (the same keys on every rank) into global means."""
    head = ("loss", "num_tokens", "replay_missing_tokens")
    totals = dist_utils.all_reduce_sum_list([sums[k] for k in head] + [sums[k] for k in METRIC_KEYS])
    tokens = max(totals[1], 1.0)
    metrics = {**dict(zip(head, totals)), "grad_norm": grad_norm}
    metrics.update({k: v / tokens for k, v in zip(METRIC_KEYS, totals[len(head) :])})
    return metrics
