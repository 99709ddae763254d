"""One whole GRPO optimizer step at long-CoT length on CPU: fastrl's trainer, FastRLGRPOTrainer, stock TRL, eager.

    PYTHONPATH=. python -m bench.long_cot_step                        # G = 2 completions of 32,768 tokens
    PYTHONPATH=. python -m bench.long_cot_step --completion-length 4096 --providers fastrl,trl

The model has Qwen2.5-0.5B's head and width (vocabulary 151,936, hidden 896, 14 / 2 heads, intermediate
4864, tied embeddings) and `--layers` layers (2), random weights saved once to a temporary directory that
every provider loads. The batch is one 256-token prompt and G completions of `--completion-length` tokens,
fixed token ids and advantages, so every provider sees the same step. fp32, SDPA attention, gradient
checkpointing, AdamW (lr 1e-6, TRL's default), gradient clipping at 1.0, DAPO / token-mean loss (β = 0).

Providers, each in a fresh interpreter (their code is bench/long_cot_providers.py):

    fastrl     fastrl's trainer update as `fastrl train` runs it: `build_model` and the `math-32k` preset's
               update settings (`--budget` = max_tokens_per_microbatch, packing auto), then `update.train_step`
    fastrl-trl `fastrl.integrations.trl.FastRLGRPOTrainer`: compute_loss, backward, clip, optimizer step
    trl        stock `trl.GRPOTrainer`, its defaults (its chunked LM head, fused AdamW), the same calls
    eager      full `[tokens, V]` logits, float32 log-softmax, the same loss; not started when its logits and
               their gradient (2·N·V·4 bytes) exceed the memory available, which is printed instead

Each provider runs one warm-up step (at `--warmup-length` completion tokens if given: the same code, a shorter
batch; with the learning rate at 0, so the weights stay the saved ones), scores the warm-up batch's completion
tokens with its own log-prob code (untimed), then runs `--steps` timed steps. The clipped gradients of the first
timed step, taken just before its optimizer step, are written out (untimed).

Checked first, against the reference provider (stock TRL; eager when TRL is not installed, said loudly): the
gradients (relative L2 over every parameter ≤ 1e-4) and the per-token log-probs (largest absolute difference
≤ 1e-4), both of which depend on the model (the on-policy loss does not: it is −mean(advantages) for any
model). The reference runs first; each other row is printed and written (`--out`) only after its check, and a
row that fails it, or has no reference to be checked against, keeps no figures. The exit status is 1 when any
provider asked for did not run and pass (eager skipped for memory excepted).
Reported: the median step time, the peak RSS over the timed steps (the whole process: weights, AdamW state,
activations) and how far it rose over the RSS before them. A watchdog stops a provider whose RSS passes
`--max-rss-gib` (default: 85 % of the memory available at the start).
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from bench.long_cot_providers import child, logp_path, save_model, status_kib

PROVIDERS = ("trl", "fastrl", "fastrl-trl", "eager")
NEEDS_TRL = ("trl", "fastrl-trl")
FIGURES = ("loss", "warmup_s", "times_s", "seconds", "peak_mib", "rise_mib")
NAMES = {"fastrl": "fastrl trainer update", "fastrl-trl": "FastRLGRPOTrainer", "trl": "trl.GRPOTrainer",
         "eager": "eager (full logits)"}  # fmt: skip
REL_TOL = 1e-4  # gradients of the first timed step: relative L2 over every parameter
LOGP_TOL = 1e-4  # per-token log-probs of the warm-up batch: largest absolute difference


def _meminfo_bytes(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


# ----------------------------------------------------------------------------- the parent


def _rel(a, b) -> float:
    return (a.double() - b.double()).norm().item() / max(a.double().norm().item(), 1e-30)


def _watch(proc, cap_bytes: int, hit: list) -> None:
    while proc.poll() is None:
        if status_kib(proc.pid, "VmRSS") * 1024 > cap_bytes:
            hit.append(True)
            proc.kill()
            return
        time.sleep(0.25)


def run_provider(name: str, opts, grads_out: str) -> dict:
    tokens = opts.group * (opts.prompt_length + opts.completion_length)
    if name == "eager":
        need = 2 * opts.group * (opts.completion_length + 1) * opts.vocab * 4
        avail = _meminfo_bytes("MemAvailable")
        if need > 0.85 * avail:
            return dict(provider=name, skipped=True, status=f"not run: logits + their gradient need "
                        f"{need / 2**30:.1f} GiB, {avail / 2**30:.1f} GiB available")  # fmt: skip
    cmd = [sys.executable, "-m", "bench.long_cot_step", "--child", name, "--grads-out", grads_out]
    cmd += [f"--{k.replace('_', '-')}={getattr(opts, k)}" for k in _SHAPE_FLAGS]
    from bench.runenv import memory_child_env

    env = memory_child_env()
    load = os.getloadavg()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    hit: list = []
    threading.Thread(target=_watch, args=(proc, opts.max_rss_bytes, hit), daemon=True).start()
    try:
        out, err = proc.communicate(timeout=opts.timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return dict(provider=name, status=f"timeout after {opts.timeout_s:.0f} s", tokens=tokens)
    row = dict(provider=name, load_start=" ".join(f"{x:.2f}" for x in load), tokens=tokens)
    if hit:
        return dict(row, status=f"stopped: RSS over {opts.max_rss_bytes / 2**30:.1f} GiB")
    if proc.returncode:
        return dict(row, status=f"exit {proc.returncode}: " + " | ".join(err.strip().splitlines()[-2:])[:300])
    return dict(row, **json.loads(out.strip().splitlines()[-1]), status="ok")


def trl_installed() -> bool:
    return importlib.util.find_spec("trl") is not None


def reference_of(names: list, trl_ok: bool) -> str | None:
    """The provider every other one is checked against: stock TRL, else eager (full logits, float32)."""
    return "trl" if "trl" in names and trl_ok else ("eager" if "eager" in names else None)


def _fail(row: dict, status: str) -> None:
    row["status"] = status
    for key in FIGURES:  # a provider that did not pass its check has no figures
        row.pop(key, None)


def check(row: dict, ref: dict | None, paths: dict) -> None:
    """`row`'s gradients of its first timed step and its per-token log-probs of the warm-up batch against the
    reference provider's; a mismatch, or no reference to check against, drops the row's figures."""
    import torch

    if row["status"] != "ok":
        return
    if ref is None or ref["status"] != "ok":
        why = (
            "no reference provider (trl or eager) in --providers"
            if ref is None
            else f"{ref['provider']} {ref['status']}"
        )
        return _fail(row, f"UNCHECKED: no reference to check against ({why})")
    name, against = row["provider"], ref["provider"]
    want, got = torch.load(paths[against]), torch.load(paths[name])
    if set(want) != set(got):
        return _fail(row, f"FAIL: gradients differ from {against}'s in which parameters have one "
                          f"({sorted(set(want) ^ set(got))[:3]})")  # fmt: skip
    row["grad_rel"] = max(_rel(g, got[n]) for n, g in want.items())
    want_lp, got_lp = torch.load(logp_path(paths[against])), torch.load(logp_path(paths[name]))
    if want_lp.shape != got_lp.shape:
        return _fail(row, f"FAIL: log-probs of shape {tuple(got_lp.shape)}, {against}'s {tuple(want_lp.shape)}")
    row["logp_diff"] = (got_lp.double() - want_lp.double()).abs().max().item()
    row["checked"] = against
    if not (row["grad_rel"] <= REL_TOL and row["logp_diff"] <= LOGP_TOL):  # NaN fails too
        _fail(row, f"FAIL against {against}: gradient rel L2 {row['grad_rel']:.1e} (≤ {REL_TOL:g}), log-prob "
                   f"max |Δ| {row['logp_diff']:.1e} (≤ {LOGP_TOL:g})")  # fmt: skip


def failed(rows: list) -> list:
    """The providers asked for that did not run and pass their check (eager skipped for memory excepted)."""
    return [r["provider"] for r in rows if r["status"] != "ok" and not r.get("skipped")]


def table(rows: list, opts, ref: str | None) -> str:
    base = next((r for r in rows if r["provider"] == ref and r["status"] == "ok"), None)
    lines = [
        f"**GRPO step, G = {opts.group} × ({opts.prompt_length} + {opts.completion_length}) tokens, "
        f"{opts.layers} layers, D = {opts.hidden}, V = {opts.vocab}, fp32, CPU, {opts.steps} timed steps; "
        f"checked against {ref or 'nothing (no reference ran)'}**",
        "",
        f"| provider | status | step s (median) | × {ref} time | peak RSS MiB | × {ref} peak | RSS rise MiB "
        "| grad rel L2 | log-prob max abs diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ok = r["status"] == "ok"
        cell = lambda key, fmt: fmt.format(r[key]) if ok and key in r else "—"  # noqa: E731
        xt = f"{r['seconds'] / base['seconds']:.2f}" if ok and base else "—"
        xm = f"{r['peak_mib'] / base['peak_mib']:.2f}" if ok and base else "—"
        reference = "reference" if r["provider"] == ref and ok else None
        lines.append(
            f"| {NAMES[r['provider']]} | {r['status']} | {cell('seconds', '{:.1f}')} | {xt} | "
            f"{cell('peak_mib', '{:.0f}')} | {xm} | {cell('rise_mib', '{:.0f}')} | "
            f"{reference or cell('grad_rel', '{:.1e}')} | {reference or cell('logp_diff', '{:.1e}')} |"
        )
    return "\n".join(lines)


_SHAPE_FLAGS = ("completion_length", "prompt_length", "group", "layers", "vocab", "hidden", "intermediate", "heads",
                "kv_heads", "budget", "steps", "warmup_length", "model_dir")  # fmt: skip


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--completion-length", type=int, default=32768)
    p.add_argument("--prompt-length", type=int, default=256)
    p.add_argument("--group", type=int, default=2, help="G: completions of the one prompt")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--intermediate", type=int, default=4864)
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--budget", type=int, default=65536, help="fastrl's max_tokens_per_microbatch (math-32k's)")
    p.add_argument("--steps", type=int, default=2, help="timed steps after the warm-up step")
    p.add_argument(
        "--warmup-length",
        type=int,
        default=0,
        help="completion length of the warm-up step (default: --completion-length)",
    )
    p.add_argument("--providers", default=",".join(PROVIDERS))
    p.add_argument("--timeout-s", type=float, default=7200, help="per provider")
    p.add_argument("--max-rss-gib", type=float, default=None)
    p.add_argument("--out", default=None, help="also write the rows as JSON here")
    p.add_argument("--model-dir", default="", help=argparse.SUPPRESS)
    p.add_argument("--child", choices=PROVIDERS, help=argparse.SUPPRESS)
    p.add_argument("--grads-out", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    unknown = [x for x in opts.providers.split(",") if x not in PROVIDERS]
    if unknown:
        p.error(f"--providers {unknown}: not among {', '.join(PROVIDERS)}")
    if opts.steps < 1 or opts.group < 1 or opts.completion_length < 1:
        p.error("--steps, --group and --completion-length must be >= 1")
    if not 0 <= opts.warmup_length <= opts.completion_length:
        p.error(f"--warmup-length {opts.warmup_length}: must be in [0, --completion-length]")
    return opts


def _write(path, rows: list, notes: list) -> None:
    if path:
        with open(path, "w") as f:
            json.dump({"argv": sys.argv[1:], "load_end": os.getloadavg(), "notes": notes, "rows": rows}, f, indent=1)


def _loud(line: str) -> None:
    print(f"\n*** {line}\n", file=sys.stderr, flush=True)


def main(argv=None) -> list:
    """The checked rows, in run order (the reference first); each is printed and written only once checked."""
    opts = parse(argv)
    if opts.child:
        print(json.dumps(child(opts)))
        return []
    opts.max_rss_bytes = int((opts.max_rss_gib or 0.85 * _meminfo_bytes("MemAvailable") / 2**30) * 2**30)
    names, trl_ok = opts.providers.split(","), trl_installed()
    ref = reference_of(names, trl_ok)
    notes = []
    if not trl_ok:
        need = [n for n in names if n in NEEDS_TRL]
        notes.append(f"TRL IS NOT INSTALLED: not run: {', '.join(need) or 'nothing'}; not checked against stock "
                     "TRL: " + (", ".join(n for n in names if n not in NEEDS_TRL and n != ref) or "nothing") + "; "
                     + (f"checked against {ref} instead" if ref else "NOTHING CHECKED: no figures"))  # fmt: skip
        _loud(notes[-1])
    rows, paths = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        opts.model_dir = os.path.join(tmp, "model")
        save_model(opts, opts.model_dir)
        for name in sorted(names, key=lambda n: n != ref):  # the reference first, so each row is checked at once
            paths[name] = os.path.join(tmp, f"{name}.pt")
            if name in NEEDS_TRL and not trl_ok:
                row = dict(provider=name, status="not run: trl is not installed")
            else:
                row = run_provider(name, opts, paths[name])
            if name != ref:
                check(row, next((r for r in rows if r["provider"] == ref), None), paths)
            rows.append(row)
            print(json.dumps(row), flush=True)
            _write(opts.out, rows, notes)  # a long run keeps what finished
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print(table(rows, opts, ref))
    for line in notes + ([f"FAILED: {', '.join(failed(rows))}: no figures (see status)"] if failed(rows) else []):
        _loud(line)
    return rows


if __name__ == "__main__":
    raise SystemExit(1 if failed(main()) else 0)
