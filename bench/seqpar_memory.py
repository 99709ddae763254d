"""Per-rank memory of one update step on one long sequence: sequence parallel 2 (Ulysses, gloo) vs 1 rank.

    PYTHONPATH=. python -m bench.seqpar_memory                      # one 65,536-token sequence
    PYTHONPATH=. python -m bench.seqpar_memory --tokens 4096 --warmup-tokens 256   # a quick check
    PYTHONPATH=. python -m bench.seqpar_memory --ranks 2             # the sequence-parallel configuration only

The model is a Qwen2 built from config at a reduced width (`--hidden` 256, `--layers` 2, 4 heads and 2 KV
heads, intermediate 1024) with Qwen2.5's vocabulary (151,936) and tied embeddings, fp32, SDPA, the trainer's
selective gradient checkpointing and tiled MLPs. The batch is one sequence (a 256-token prompt and the rest
completion), one micro-batch, token-mean loss, AdamW: `update.train_step`, the trainer's step. Each
configuration runs in fresh processes: 1 rank, and 2 gloo ranks under `torchrun` with
`StepSettings(sequence=...)` (the micro-batch split over the sequence group). Torch threads: the machine's
cores divided by the ranks.

Each process takes a warm-up step at `--warmup-tokens` (the optimizer state, thread pools and libraries come
up there), then one measured step. Reported per rank: the resident memory just before the measured step, its
peak during the step (`VmHWM` after `/proc/self/clear_refs`), their difference (the step's activations,
gradients and transients) and the step time; the loss and gradient norm, which must agree between the two
configurations (else FAIL and no figures). Every process runs glibc's allocator with the bench's fixed mmap
threshold (`bench.runenv.memory_child_env`), so that the RSS follows the live memory rather than the heap pages an
earlier phase freed; `--default-allocator` runs it unpinned.
"""

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

PROMPT = 256


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _model(opts):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from fastrl.hf import enable_checkpointing

    config = Qwen2Config(
        vocab_size=opts.vocab, hidden_size=opts.hidden, intermediate_size=opts.intermediate,
        num_hidden_layers=opts.layers, num_attention_heads=4, num_key_value_heads=2, rope_theta=1e6,
        max_position_embeddings=opts.tokens, tie_word_embeddings=True,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).float()
    enable_checkpointing(model)  # the trainer's: non-reentrant, the attention kernel's outputs kept
    model.train()
    return model


def _sample(opts, tokens: int):
    import torch

    from fastrl.trainer.batching import Sample

    ids = torch.randint(3, opts.vocab, (tokens,), generator=torch.Generator().manual_seed(1)).tolist()
    return [Sample(ids[:PROMPT], ids[PROMPT:], 1.0)]


def child(opts) -> None:
    import torch

    from fastrl.losses import LossConfig
    from fastrl.trainer import distributed as dist_utils
    from fastrl.trainer.build import make_adamw
    from fastrl.trainer.sequence_parallel import init_sequence_parallel
    from fastrl.trainer.update import StepSettings, train_step

    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist_utils.init_from_env("cpu")
    model = _model(opts)
    optimizer = make_adamw(model.parameters(), lr=1e-6)  # the trainer's
    sp = init_sequence_parallel(world) if world > 1 else None  # the group splits the one sequence

    def step(tokens):
        settings = StepSettings(LossConfig(), tokens, True, 0, log_entropy=False, sequence=sp)
        return train_step(model, optimizer, _sample(opts, tokens), settings)

    step(opts.warmup_tokens)
    gc.collect()
    dist_utils.barrier()
    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    start = time.perf_counter()
    out = step(opts.tokens)
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM")
    row = dict(world=world, rank=dist_utils.rank(), before_mib=before / 1024, peak_mib=peak / 1024,
               step_mib=(peak - before) / 1024, step_s=seconds, loss=out["loss"], grad_norm=out["grad_norm"],
               threads=torch.get_num_threads())  # fmt: skip
    with open(os.path.join(opts.result_dir, f"rank{row['rank']}.json"), "w") as f:  # one file a rank: lines
        json.dump(row, f)  # printed by two ranks can interleave
    dist_utils.cleanup()


def _run(opts, world: int) -> list[dict]:
    from bench.runenv import memory_child_env

    result_dir = tempfile.mkdtemp(prefix="seqpar-memory-")
    skip = ("child", "ranks", "result_dir", "live_rss")
    args = [f"--{k.replace('_', '-')}={v}" for k, v in vars(opts).items() if k not in skip]
    args += ["--child", f"--result-dir={result_dir}"]
    if world == 1:
        cmd = [sys.executable, "-m", "bench.seqpar_memory", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}", "--standalone",
               "-m", "bench.seqpar_memory", *args]  # fmt: skip
    env = memory_child_env() if opts.live_rss else None
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=opts.timeout, env=env)
    rows = []
    for name in sorted(os.listdir(result_dir)):
        with open(os.path.join(result_dir, name)) as f:
            rows.append(json.load(f))
    shutil.rmtree(result_dir, ignore_errors=True)
    if proc.returncode or len(rows) != world:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return sorted(rows, key=lambda r: r["rank"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--warmup-tokens", type=int, default=512)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--ranks", type=int, choices=(1, 2), nargs="+", default=[1, 2], help="the configurations to run")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per configuration")
    p.add_argument(
        "--default-allocator",
        dest="live_rss",
        action="store_false",
        help="run glibc's allocator unpinned (freed heap pages stay resident and count in the RSS)",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result-dir", help=argparse.SUPPRESS)
    opts = p.parse_args()
    for name in ("tokens", "warmup_tokens"):
        if getattr(opts, name) <= PROMPT:
            flag = f"--{name.replace('_', '-')}={getattr(opts, name)}"
            p.error(f"{flag} leaves no completion after the {PROMPT}-token prompt")
    if opts.child:
        return child(opts)
    from bench.runenv import git_sha, load_average

    allocator = "glibc's default" if not opts.live_rss else "mmap threshold 128 KiB (RSS follows live memory)"
    print(f"git {git_sha()}, load {load_average()}, {os.cpu_count()} cores; {opts.tokens} tokens, D={opts.hidden}, "
          f"{opts.layers} layers, V={opts.vocab}; allocator: {allocator}")  # fmt: skip
    runs = {world: _run(opts, world) for world in sorted(set(opts.ranks))}
    if len(runs) == 2:
        ref = runs[1][0]
        agree = all(
            abs(r["loss"] - ref["loss"]) <= 1e-5 * max(1.0, abs(ref["loss"]))
            and abs(r["grad_norm"] - ref["grad_norm"]) <= 1e-4 * ref["grad_norm"]
            for r in runs[2]
        )
        verdict = "agree" if agree else "FAIL: the runs disagree, no figures"
        print(f"loss {ref['loss']:.6f} / {runs[2][0]['loss']:.6f}, grad norm {ref['grad_norm']:.6g} / "
              f"{runs[2][0]['grad_norm']:.6g}: {verdict}")  # fmt: skip
        if not agree:
            sys.exit(1)
    else:  # one configuration: nothing to compare its loss with
        only = next(iter(runs.values()))[0]
        print(f"loss {only['loss']:.6f}, grad norm {only['grad_norm']:.6g} (not compared: one configuration run)")
    print("| ranks | rank | threads | resident before MiB | peak MiB | step (peak − before) MiB | step s |")
    print("|---|---|---|---|---|---|---|")
    for world, rows in runs.items():
        for r in rows:
            print(f"| {world} | {r['rank']} | {r['threads']} | {r['before_mib']:.0f} | {r['peak_mib']:.0f} | "
                  f"{r['step_mib']:.0f} | {r['step_s']:.1f} |")  # fmt: skip
    if len(runs) == 2:
        ratio = max(r["step_mib"] for r in runs[2]) / runs[1][0]["step_mib"]
        print(f"step memory per rank, sequence parallel 2 / 1 rank: {ratio:.2f} (load {load_average()})")


if __name__ == "__main__":
    main()
