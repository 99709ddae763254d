"""fastrl's fused backend under verl's Ulysses sequence parallelism, 2 gloo ranks; runs in verl's environment:

    PYTHONPATH=<repo> <verl python> tests/integrations/verl_ulysses_checks.py OUT_DIR

verl's FSDP2 engine with `ulysses_sequence_parallel_size=2` (dp 1: both ranks hold the same batch, each
half of every packed micro-batch): verl's engine slices the remove-padding inputs and the globally rolled
labels, passes the labels as `shift_labels`, and its patched attention all-to-alls heads and sequence
around the attention kernel. Cases, on the untied Qwen2 of `verl_engine_checks.py`:

- "verl":   verl's logits path under Ulysses (log-probs from the sliced global labels): the reference;
- "fastrl": fastrl's fused backend under Ulysses: log-probs, entropy (no-grad and training passes), loss
            and gradients equal to "verl" at fp32 rel 1e-5;
- "sp1":    verl's logits path without Ulysses on the same batch: its log-probs equal "verl"'s, so the
            sequence-parallel forward itself is exact on this machine.

verl's Ulysses attention wraps the flash-attention kernel, which has no CPU build. This file registers an
attention named "cpu_varlen" through transformers' AttentionInterface that is transformers' own
flash-attention integration (which verl's `apply_monkey_patch` wraps with its all-to-all), and hands verl's
wrapper a varlen causal attention (PyTorch SDPA per packed sequence) in place of the CUDA kernel. Every
other step is verl's code.

- "planted": a planted mutant of "fastrl" whose forward rolls the labels of its local shard instead of taking
            `shift_labels` verbatim: one label per shard boundary is then wrong, and it must differ from "verl".
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from verl_engine_checks import init_rank, leave, rel_diff, run_variant, save_models


def varlen_causal_attention(q, k, v, attention_mask, query_length, *args, position_ids=None, **kwargs):
    """flash-attention's varlen contract on CPU: `[1, S, H, D]` packed rows, a sequence starts where
    `position_ids` restarts at 0; causal within each sequence, grouped KV heads repeated."""
    assert q.shape[0] == 1 and attention_mask is None and position_ids is not None
    starts = torch.nonzero(position_ids.reshape(-1) == 0).reshape(-1).tolist() + [q.shape[1]]
    rep = q.shape[2] // k.shape[2]
    out = []
    for a, b in zip(starts[:-1], starts[1:]):
        qs, ks, vs = (t[0, a:b].transpose(0, 1) for t in (q, k, v))  # [H, L, D]
        ks, vs = ks.repeat_interleave(rep, 0), vs.repeat_interleave(rep, 0)
        scale = kwargs.get("softmax_scale")
        out.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale).transpose(0, 1))
    return torch.cat(out, 0).unsqueeze(0)


def register_cpu_attention():
    import verl.models.transformers.monkey_patch as verl_patch
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.flash_attention import flash_attention_forward
    from transformers.masking_utils import flash_attention_mask

    AttentionInterface.register("cpu_varlen", flash_attention_forward)
    AttentionMaskInterface.register("cpu_varlen", flash_attention_mask)
    verl_patch._flash_attention_forward = varlen_causal_attention  # the kernel under verl's all-to-all


def rolled_per_shard(self, *args, shift_labels=None, **kwargs):
    """The bug `shift_labels` exists to prevent: labels rolled on the local sequence shard."""
    import fastrl.integrations.verl as fv

    return fv.forward_with_fastrl_backend(self, *args, **kwargs)


def worker(rank, world, init_file, path, out_dir):
    init_rank(rank, world, init_file)
    run_cases(rank, path, out_dir)
    leave()


def run_cases(rank, path, out_dir):
    """Every case on this rank, in the 2-rank group `init_rank` joined; each writes `<out_dir>/<case>-rankR`."""
    register_cpu_attention()
    cases = {
        "verl": dict(variant="verl", sp=2, attn="cpu_varlen"),
        "fastrl": dict(variant="fastrl", sp=2, attn="cpu_varlen"),
        "sp1": dict(variant="verl", sp=1, attn="sdpa"),
        "planted": dict(variant="fastrl", sp=2, attn="cpu_varlen", fused_forward=rolled_per_shard),
    }
    for name, case in cases.items():
        result = run_variant(path, seed=0, **case)  # the same batch on both ranks (one Ulysses group)
        torch.save(result, os.path.join(out_dir, f"{name}-rank{rank}.pt"))
        dist.barrier()


def diffs_to(got, ref) -> dict:
    """The max relative differences of `got`'s outputs, loss and gradients to `ref`'s."""
    diffs = {k: rel_diff(got[k], ref[k]) for k in ("old_logp", "old_entropy", "logp", "entropy", "loss")}
    diffs["grads"] = max(rel_diff(got["grads"][n], g) for n, g in ref["grads"].items())
    return diffs


def compare(out_dir):
    failures = []
    for rank in range(2):
        ref, got, sp1, planted = (
            torch.load(os.path.join(out_dir, f"{n}-rank{rank}.pt")) for n in ("verl", "fastrl", "sp1", "planted")
        )
        assert got["head_is_unit"], "verl did not wrap the untied head as its own unit"
        exact = max(rel_diff(ref[k], sp1[k]) for k in ("old_logp", "old_entropy"))
        print(f"ulysses sp=2 vs sp=1 (verl's logits path), rank {rank}: max rel log-prob/entropy {exact:.1e}")
        if exact > 1e-5:
            failures.append(f"rank {rank}: verl's Ulysses forward differs from sp=1 by {exact:.1e}")
        diffs = diffs_to(got, ref)
        # every call: the local shard's labels (1, total_nnz / 2) give outputs of their shape
        assert all(s[0][0] == 1 and s[0] == s[1] == s[2] for s in got["seen"]), got["seen"]
        verdict = "ok" if max(diffs.values()) <= 1e-5 else "MISMATCH"
        line = " ".join(f"{k}={v:.1e}" for k, v in diffs.items())
        print(f"{verdict} untied rank {rank} ulysses sp=2 fastrl vs verl logits path: max rel {line}")
        if verdict != "ok":
            failures.append(f"rank {rank}: {line}")
        mutant = max(diffs_to(planted, ref).values())
        if mutant > 1e-5:
            print(f"caught mutant planted untied rank {rank}: max rel diff {mutant:.1e}")
        else:
            failures.append(f"rank {rank}: the planted mutant (labels rolled per shard) not caught: {mutant:.1e}")
    return failures


def main(out_dir):
    with tempfile.TemporaryDirectory() as tmp:
        path = save_models(tmp)[False]
        init_file = os.path.join(tmp, "rdv")
        mp.spawn(worker, args=(2, init_file, path, out_dir), nprocs=2, join=True)
    failures = compare(out_dir)
    if failures:
        print("\n".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1])
