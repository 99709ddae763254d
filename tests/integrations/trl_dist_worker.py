"""The ranks of multi-process TRL GRPO runs: `python -m torch.distributed.run --nproc_per_node 2 trl_dist_worker.py
SPEC.json` (tests/integrations/test_trl_distributed.py launches it).

One launch runs the spec's rows in turn. A row names its engine ("ddp", "fsdp2" or "zero3"; accelerate's MULTI_CPU
with gloo; a `GRPOConfig` resets accelerate's state, so each row starts its own), its `GRPOConfig` overrides and
its model (a saved one, or a tied head or not); the spec names the trainers each row runs one after the other from
the same seed ("stock" = `trl.GRPOTrainer`, "fastrl" = `FastRLGRPOTrainer`). A ZeRO-3 row with "head": true runs
fastrl's head alone in a DeepSpeed engine instead (`zero3_head`). Each rank writes `<out>/<row>/<trainer>-rank<r>.pt`:
the trained parameters (full tensors), the log history, every log-prob tensor the trainer computed (generation's
old / reference passes and the training forwards, in call order) with the completion-token count of each call,
how many times the LM head was gathered per scoring call and, under ZeRO-3, the head's numel at each of fastrl's
reads. It prints `row <name>` as each row starts, so a failed launch names the row.
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import trl_harness as h  # noqa: E402

ZERO3 = {
    "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
    # persistence threshold 0: every parameter is partitioned, however small (the default keeps < 1e5 elements whole)
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "zero_allow_untested_optimizer": True, "bf16": {"enabled": False}, "fp16": {"enabled": False},
}  # fmt: skip


def engine_fields(engine: str, head_unit: bool = False) -> dict:
    """`GRPOConfig` fields for the engine. `head_unit`: under FSDP2, every `nn.Linear` (the head included) is its
    own FSDP unit, so the head's weight is a sharded DTensor when the fused forward reads it without calling the
    module; otherwise accelerate puts the head in one unit with the final norm (gathered by the norm's forward)."""
    if engine == "ddp":
        return {}
    if engine == "fsdp2":
        config = {"fsdp_version": 2, "reshard_after_forward": True}
        if head_unit:
            config["transformer_layer_cls_to_wrap"] = ["Qwen2DecoderLayer", "Linear"]
        return dict(fsdp="full_shard", fsdp_config=config)
    if engine == "zero3":
        return dict(deepspeed=ZERO3)
    raise ValueError(f"unknown engine {engine!r}")


def allow_fsdp_on_cpu() -> None:
    """accelerate (1.15) turns an FSDP plugin into DistributedType.FSDP only on accelerator devices; on CPU it
    drops it and wraps the model in DDP. Keep the plugin under MULTI_CPU so `fsdp2_prepare_model` shards the model
    as it does on GPUs (fully_shard over a gloo mesh: the same units, DTensor parameters)."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    init = AcceleratorState.__init__

    def init_keeping_fsdp(self, *args, fsdp_plugin=None, **kwargs):
        init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin

    AcceleratorState.__init__ = init_keeping_fsdp


def full_params(trainer) -> dict:
    """Every trained parameter as a full tensor on this rank (gathered from its shard under FSDP2 / ZeRO-3)."""
    out = {}
    for name, p in trainer.model_wrapped.named_parameters():
        name = name.removeprefix("module.")
        if hasattr(p, "full_tensor"):
            out[name] = p.full_tensor().detach().clone()
        elif hasattr(p, "ds_id"):
            import deepspeed

            with deepspeed.zero.GatheredParameters([p]):
                out[name] = p.detach().clone()
        else:
            out[name] = p.detach().clone()
    return out


def count_head_gathers(record: dict) -> None:
    """Count DTensor.full_tensor() calls on a [V, D] tensor and ZeRO-3 GatheredParameters entries."""
    from torch.distributed.tensor import DTensor

    full_tensor = DTensor.full_tensor

    def counted(self, *args, **kwargs):
        if self.dim() == 2 and self.shape[0] == record["vocab"]:
            record["gathers"] += 1
        return full_tensor(self, *args, **kwargs)

    DTensor.full_tensor = counted
    try:
        import deepspeed

        gathered = deepspeed.zero.GatheredParameters
        enter = gathered.__enter__

        def counted_enter(self):
            if getattr(self, "enabled", True) and any(p.ds_shape[0] == record["vocab"] for p in self.params):
                record["gathers"] += 1
            return enter(self)

        gathered.__enter__ = counted_enter
    except ImportError:
        pass


def count_head_reads(record: dict) -> None:
    """Record the numel of the ZeRO-3 head's weight where fastrl reads it (0: partitioned), per read."""
    import fastrl.integrations.trl.head as head

    scored = head.zero3_scored

    def counted(score, hidden, params):
        record["reads"].append(params[0].numel() if params else -1)
        return scored(score, hidden, params)

    head.zero3_scored = counted


def run(kind: str, row: dict, rank: int, base, out: str) -> None:
    from trl import GRPOTrainer

    from fastrl.integrations.trl import FastRLGRPOTrainer

    fields = dict(optim="sgd", **engine_fields(row["engine"], row.get("head_unit", False)), **row.get("overrides", {}))
    args = h.config(os.path.join(out, kind), **fields)
    record = {"vocab": 64, "gathers": 0, "logps": [], "tokens": [], "gathers_per_call": [], "head": [], "reads": [],
              "reads_per_call": []}  # fmt: skip
    count_head_gathers(record)
    count_head_reads(record)
    cls = FastRLGRPOTrainer if kind == "fastrl" else GRPOTrainer
    logs, params = h.run(cls, args, base, wrap=lambda t: _record(t, record), params=full_params)
    torch.save(
        {"params": params, "logs": logs, "logps": record["logps"], "tokens": record["tokens"],
         "gathers_per_call": record["gathers_per_call"], "head": record["head"],
         "reads_per_call": record["reads_per_call"]},
        os.path.join(out, f"{kind}-rank{rank}.pt"),
    )  # fmt: skip


def _record(trainer, record):
    """Record every scoring forward in call order: TRL's `_get_per_token_logps_and_entropies`, and fastrl's
    `_fastrl_scored_loss` (a training micro-batch whose loss is formed in the forward); both return logp first."""

    def recording(score, chunked: bool):
        def recorded(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
            weight = trainer.accelerator.unwrap_model(model).get_output_embeddings().weight
            local = weight.to_local() if hasattr(weight, "to_local") else weight
            record["head"].append((type(weight).__name__, local.numel()))  # what the head holds outside the call
            before, reads = record["gathers"], len(record["reads"])
            out = score(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
            rows = input_ids.shape[0]
            chunk = ((args[0] if args else kwargs.get("batch_size")) if chunked else None) or rows  # TRL's batch_size
            record["gathers_per_call"].append((record["gathers"] - before, -(-rows // chunk)))  # (gathers, forwards)
            record["reads_per_call"].append(record["reads"][reads:])  # fastrl's head reads in this call
            record["logps"].append(out[0].detach().clone())
            record["tokens"].append(int(attention_mask[:, -logits_to_keep:].sum()))
            return out

        return recorded

    trainer._get_per_token_logps_and_entropies = recording(trainer._get_per_token_logps_and_entropies, True)
    if hasattr(trainer, "_fastrl_scored_loss"):
        trainer._fastrl_scored_loss = recording(trainer._fastrl_scored_loss, False)
    return trainer


def zero3_head(row: dict, rank: int, out_dir: str) -> None:
    """fastrl's head on a ZeRO-3-partitioned model, called through the engine's forward as TRL calls it: rank 0
    scores `row["tokens"][0]` completion tokens, rank 1 `row["tokens"][1]` (0 allowed). Writes logp, entropy,
    the head's averaged d_weight (DeepSpeed's own reduction), the head's numel outside the call and the number of
    head gathers."""
    import deepspeed
    from deepspeed.utils import safe_get_full_grad

    from fastrl.integrations.trl import add_fastrl_lm_head

    record = {"vocab": 64, "gathers": 0, "reads": []}
    config = {**ZERO3, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "train_batch_size": 4}
    model = h.model()
    add_fastrl_lm_head(model, temperature=0.7)
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=config)
    count_head_gathers(record)
    count_head_reads(record)
    weight = engine.module.lm_head.weight
    outside = weight.numel()
    ids, labels = zero3_batch(rank, row["tokens"][rank])
    out = engine(input_ids=ids, labels=labels, fused_lm_head=True)
    engine.backward(out.log_probs.sum() + 0.1 * out.entropy.sum())
    torch.save(
        {"logp": out.log_probs.detach(), "entropy": out.entropy.detach(), "d_weight": safe_get_full_grad(weight),
         "gathers": record["gathers"], "outside_numel": outside, "reads": record["reads"]},
        os.path.join(out_dir, f"zero3-head-rank{rank}.pt"),
    )  # fmt: skip


def zero3_batch(rank: int, tokens: int):
    """Two sequences of 25 ids; the last `tokens` next-token labels of the flattened batch are scored."""
    generator = torch.Generator().manual_seed(rank)
    ids = torch.randint(3, 64, (2, 25), generator=generator)
    labels = torch.full_like(ids, -100)
    scored = labels[:, 1:].reshape(-1)
    if tokens:
        scored[-tokens:] = ids[:, 1:].reshape(-1)[-tokens:]
    labels[:, 1:] = scored.view(2, 24)
    return ids, labels


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    rank = int(os.environ["RANK"])
    allow_fsdp_on_cpu()  # acts on an FSDP plugin only
    for row in spec["rows"]:
        print(f"row {row['name']}", flush=True)
        out = os.path.join(spec["out"], row["name"])
        os.makedirs(out, exist_ok=True)
        if row["engine"] == "zero3":
            import deepspeed

            # TRL loads the reference model from the policy's path under `deepspeed.zero.Init` (transformers does
            # so whenever a ZeRO-3 config is alive), which needs DeepSpeed's process group (accelerate starts it on
            # GPUs, not under MULTI_CPU); the head row's engine needs it too. Once started, this is a no-op.
            deepspeed.init_distributed(dist_backend="gloo")
        if row.get("head"):
            zero3_head(row, rank, out)
            continue
        # A ZeRO-3 policy is loaded here, before any config: a policy TRL itself loads under zero.Init fails stock
        # TRL's backward on this CPU setup (a [*, 32] parameter seen with 0 columns).
        path = row.get("model_path")
        base = (h.load(path) if row["engine"] == "zero3" else path) if path else h.model(tie=row.get("tie", False))
        for kind in spec["trainers"]:
            run(kind, row, rank, base, out)


if __name__ == "__main__":
    main(sys.argv[1])
