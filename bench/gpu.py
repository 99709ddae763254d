"""`python -m bench.gpu`: the whole GPU check in one command (≤ 8 min on one H200).

    PYTHONPATH=. python -m bench.gpu              # one CUDA GPU
    PYTHONPATH=. python -m bench.gpu --dry-run    # tiny shapes on CPU, Triton interpreter (CI runs this)

1. kernels (bench/gpu_kernels.py): the Triton log-prob kernels against a float64 / chunked float32 truth at
   real shapes, then their timings against eager and a bf16 matmul;
2. replay (bench/gpu_replay.py): the kept-set kernels at N=32,768, D=4,096, V=151,936, k=50 against the float32
   torch walk and a float64 reference, two calls and a row alone vs in the batch bit for bit (and a row alone vs
   in the batch for the plain kernels with batch_invariant=True), and their time beside the plain kernel's;
3. peers (bench/gpu_peers.py): grpo_loss and token_logprobs fwd+bwd against every peer on the live rows,
   each checked against eager first, with TFLOP/s and peak memory;
4. FSDP2 (bench/gpu_fsdp.py): one training step of a small random Hugging Face model with fastrl's update;
5. async (bench/gpu_async.py): a few `fastrl train --async-staleness 1` steps, the rollout process colocated on
   the GPU (weights over vLLM's ipc engine): steps/s, finite rewards and log-probs, staleness <= 1. The
   `--rollout-gpus` case needs two GPUs and is skipped, said so; `--dry-run` skips the part with its reason.

Each part's table is printed as it finishes, and the short summary table last. With `OUT` set, the results
go to `$OUT/gpu.json`. Exit status 1 when a part fails its correctness check.
"""

import argparse
import json
import os
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU under TRITON_INTERPRET=1")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--parts", default="kernels,replay,peers,fsdp,async", help="comma-separated subset of those parts")
    args = p.parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before torch and triton load
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device is visible to torch (use --dry-run on CPU)")
    from bench import gpu_async, gpu_fsdp, gpu_kernels, gpu_peers, gpu_replay

    runners = {"kernels": lambda: gpu_kernels.main(args.dry_run, 1 if args.dry_run else args.reps),
               "replay": lambda: gpu_replay.main(args.dry_run, 1 if args.dry_run else args.reps),
               "peers": lambda: gpu_peers.main(args.dry_run, 1 if args.dry_run else args.reps),
               "fsdp": lambda: gpu_fsdp.main(args.dry_run),
               "async": lambda: gpu_async.main(args.dry_run)}  # fmt: skip
    out, summary = {}, []
    for name in [x for x in args.parts.split(",") if x]:
        start = time.perf_counter()
        try:
            res = runners[name]()
        except Exception as exc:  # a crashed part is reported, and the others still run
            res = {"pass": False, "table": f"{name} raised {type(exc).__name__}: {str(exc)[:300]}"}
        res["seconds"] = round(time.perf_counter() - start, 1)
        out[name] = res
        print(f"\n**{name}** ({res['seconds']} s)\n\n{res['table']}\n", flush=True)
        summary.append(f"| {name} | {'PASS' if res['pass'] else 'FAIL'} | {res['seconds']} |")
    device = "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name()
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu.json"), "w") as f:
            json.dump({"device": device, "torch": torch.__version__, "parts": out}, f, indent=1, default=str)
    print(f"\n**bench.gpu on {device}**\n\n| part | verdict | seconds |\n|---|---|---|\n" + "\n".join(summary))
    return 0 if all(r["pass"] for r in out.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
