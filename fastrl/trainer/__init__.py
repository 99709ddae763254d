"""A thin GRPO trainer on the fused loss: `fastrl train --preset tiny` (CPU) or `--preset math-32k` (GPU).

`trainer.py` is the loop over a batch source (`sources.py`, `async_source.py`); `build.py` (setting up) and
`stages.py` (one iteration) are its steps. Every module:

    config.py              TrainConfig (frozen) holding a fastrl.LossConfig
    presets.py             the named presets (--preset) and YAML / JSON config files
    validate.py            per-field checks and ConfigError (the field and value that are wrong)
    preflight.py           checks and reward resolution before anything is built
    cli.py, __main__.py    `fastrl train ...` / `python -m fastrl.trainer train ...`
    tasks.py               problems, the arithmetic task, JSONL / HF-dataset loaders, the resumable PromptStream
    rollout/               sampling G completions per prompt
      interface.py           the interface (Completion, RolloutEngine), prompt building and end tokens
      sampling.py            SamplingEngine: what both engines are built from, `(model, tokenizer, config)`
      hf_engine.py           transformers `generate` on the training model
      vllm_engine.py         vLLM in the trainer's process
      vllm_kept.py           the kept sets vLLM sampled from: its sampling mask, or our recording logits processor
      thinking.py            the thinking budget: sampling in rounds
      tool_turns.py          multi-turn tool rollouts: cut at a call, run the round's calls, append observation ids
      async_worker.py        the rollout process of --async-staleness: its vLLM engine, seeds, partial rollouts
      async_client.py        the trainer's side of it: spawn, submit, groups, heartbeat and death detection
      process_setup.py       the rollout process's own setup: dying with its parent, its CPU cores
      shm_transfer.py        a shared-memory weight-transfer engine registered with vLLM's factories (CPU)
      weight_push.py         the weights to the rollout process through shared memory (CPU)
      devices.py             --rollout-gpus: the trainer ranks' and the rollout process's GPUs, as a pure plan
      nccl_weights.py        weights over vLLM's NCCL engine: cast one tensor at a time, the label with them, a watchdog
      ipc_weights.py         weights over vLLM's ipc engine to a rollout process colocated on a trainer's GPU
    scoring.py             rewards (fastrl.rewards) -> shaping -> advantages -> samples, metric sums
    advantages.py          group z-score advantages
    batching.py            token-budget micro-batches, padded or packed; the samples' kept sets as CSR
    update.py              StepSettings and train_step: one optimizer step of fastrl.grpo_loss; sequence_logprobs
    distributed.py         torchrun data parallelism: prompt sharding, summed gradients and counts
    fsdp.py                --fsdp: FSDP2 sharding and sharded forward calls
    sequence_parallel.py   --sequence-parallel: data-parallel x sequence groups, a micro-batch's blocks, normalizers
    ulysses.py             the sequence-parallel attention: all-to-alls, one document at a time (AttentionInterface)
    checkpoint.py          atomic checkpoints (the staging write both kinds use), resume, output-dir guard
    sharded_checkpoint.py  --fsdp checkpoints (torch.distributed.checkpoint); export to a HF directory
    metrics.py             metrics.jsonl (+ TensorBoard), progress lines
    trackers.py            --report-to: TensorBoard, W&B, MLflow (rank 0 only, imported when asked for, resumable)
    eval_metrics.py        held-out evaluation metrics: unbiased pass@k, mean@k, maj@k; eval/step-N.jsonl
    eval_sets.py           held-out arithmetic problems the training stream never draws
    tool_options.py        the tool options (--tools, --tool-format, ...): the tools they name, their checks
    eval_options.py        the eval options: eval sets by name, their checks at config time, when an eval is due
    evaluation.py          evaluation during training: loading the sets, sampling without gradient, gathering to rank 0
    plot.py                `fastrl plot`: a run's curves (or several runs' overlaid) as one PNG
    build.py               start_run: device, process group, model, data, warm-up, reference, optimizer, resume
    warmup.py              the supervised warm-up (warmup_sft_steps) on the tiny task's demonstrations
    stages.py              Batch, collect, score_batch, attach_logprobs, minibatches, optimizer_step, step_record,
                           save_run
    staleness.py           policy-version spans of tokens, the admission rule, staleness metrics
    prompt_ledger.py       prompt ids trained and in flight: each prompt trained once across drops and resumes
    async_feed.py          AsyncFeed: prompts out, admitted groups in, the step's async metrics and timeline
    sources.py             the synchronous batch source: collect, score, attach log-probs in this process
    async_source.py        the batch source of --async-staleness K: rollouts in their own process, a push per step
    trainer.py             train(): the one loop over a batch source
    tiny/                  the CPU preset's pieces
      model.py               tiny Llama-architecture model and character tokenizer
      warmup.py              the noisy demonstrations of the addition task (the warm-up's targets)
      export.py              the pair as a Hugging Face model directory (for vLLM)

The Hugging Face model plumbing (body and head, tiled MLPs, checkpointing) is `fastrl.hf`; see docs/trainer.md.
Names below load lazily, so importing `fastrl.trainer` does not pull in transformers.
"""

import importlib

_EXPORTS = {
    "TrainConfig": "config",
    "PRESETS": "config",
    "make_config": "config",
    "train": "trainer",
    "group_advantages": "advantages",
    "plan_microbatches": "batching",
    "StepSettings": "update",
    "train_step": "update",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
