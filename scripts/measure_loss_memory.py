"""Extra peak host memory of grpo_loss fwd+bwd on CPU, fused (chunked torch path) vs eager full logits.

Each variant runs in a fresh subprocess. "Extra" = peak RSS (ru_maxrss) − RSS once the inputs exist
− the bytes of the gradient buffers the step must produce (d_hidden, d_weight): what the loss itself
costs on top of its inputs and outputs. The eager variant is fastrl.kernels.token_logprobs_reference
(builds the [B·T, V] logits) followed by the same policy_loss torch math.

    python scripts/measure_loss_memory.py                 # B=8 T=1024 D=512 V=32768 fp32
    python scripts/measure_loss_memory.py --entropy-coef 0.01
"""

import argparse
import json
import resource
import subprocess
import sys


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def child(args) -> dict:
    import time

    import torch

    from fastrl import LossConfig, grpo_loss, policy_loss
    from fastrl.kernels import LogprobParams, token_logprobs_reference

    torch.manual_seed(0)
    B, T, D, V = args.B, args.T, args.D, args.V
    hidden = torch.randn(B, T, D).requires_grad_(True)
    weight = (torch.randn(V, D) / D**0.5).requires_grad_(True)
    targets = torch.randint(0, V, (B, T))
    mask = torch.arange(T)[None, :] < torch.randint(T // 2, T + 1, (B, 1))
    adv = torch.randn(B)
    # logits are ~N(0, 1), so log-probs sit near −log V: keep old/ref there for realistic ratios
    old = -torch.log(torch.tensor(float(V))) - 0.5 + 0.3 * torch.randn(B, T)
    ref = old + 0.1 * torch.randn(B, T)
    cfg = LossConfig(loss_agg="grpo", beta=0.04, entropy_coef=args.entropy_coef)
    base = _rss_bytes()
    t0 = time.perf_counter()
    if args.variant == "fused":
        out = grpo_loss(
            hidden, weight, targets, mask, adv, old_logprobs=old, ref_logprobs=ref, config=cfg, impl="torch"
        )
    else:
        params = LogprobParams(cfg.temperature, -100, cfg.entropy_coef != 0)
        safe = torch.where(mask, targets, torch.full_like(targets, -100))
        lp, ent = token_logprobs_reference(hidden.reshape(-1, D), weight, safe.reshape(-1), None, params)
        lp = lp.reshape(B, T)
        ent = None if ent is None else ent.reshape(B, T)
        out = policy_loss(lp, adv, mask, old_logprobs=old, ref_logprobs=ref, entropy=ent, config=cfg, impl="torch")
    out.loss.backward()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    grad_bytes = hidden.grad.numel() * 4 + weight.grad.numel() * 4
    return dict(
        variant=args.variant,
        extra_mib=(peak - base - grad_bytes) / 2**20,
        peak_mib=peak / 2**20,
        base_mib=base / 2**20,
        grad_mib=grad_bytes / 2**20,
        seconds=seconds,
        loss=out.loss.item(),
        w_grad_norm=weight.grad.norm().item(),
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--B", type=int, default=8)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--D", type=int, default=512)
    p.add_argument("--V", type=int, default=32768)
    p.add_argument("--entropy-coef", type=float, default=0.0)
    p.add_argument("--variant", choices=["fused", "eager"])
    args = p.parse_args()
    if args.variant:
        print(json.dumps(child(args)))
        return
    results = {}
    for variant in ("fused", "eager"):
        cmd = [sys.executable, __file__, "--variant", variant] + sys.argv[1:]
        results[variant] = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        print(json.dumps(results[variant]))
    f, e = results["fused"], results["eager"]
    print(f"shape B={args.B} T={args.T} D={args.D} V={args.V} fp32, entropy_coef={args.entropy_coef}")
    ratio = e["extra_mib"] / f["extra_mib"]
    print(f"extra peak: fused {f['extra_mib']:.0f} MiB, eager {e['extra_mib']:.0f} MiB, ratio {ratio:.1f}x")
    print(
        f"same result: loss {f['loss']:.6f} vs {e['loss']:.6f}, |dW| {f['w_grad_norm']:.6f} vs {e['w_grad_norm']:.6f}"
    )


if __name__ == "__main__":
    main()
