"""One whole GRPO optimizer step at long-CoT length on CPU: fastrl's trainer, FastRLGRPOTrainer, stock TRL, eager.

    PYTHONPATH=. python -m bench.long_cot_step                        # G = 2 completions of 32,768 tokens
    PYTHONPATH=. python -m bench.long_cot_step --completion-length 4096 --providers fastrl,trl

The model has Qwen2.5-0.5B's head and width (vocabulary 151,936, hidden 896, 14 / 2 heads, intermediate
4864, tied embeddings) and `--layers` layers (2), random weights saved once to a temporary directory that
every provider loads. The batch is one 256-token prompt and G completions of `--completion-length` tokens,
fixed token ids and advantages, so every provider sees the same step. fp32, SDPA attention, gradient
checkpointing, AdamW (lr 1e-6, TRL's default), gradient clipping at 1.0, DAPO / token-mean loss (β = 0).

Providers, each in a fresh interpreter:

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
import statistics
import subprocess
import sys
import tempfile
import threading
import time

PROVIDERS = ("trl", "fastrl", "fastrl-trl", "eager")
NEEDS_TRL = ("trl", "fastrl-trl")
FIGURES = ("loss", "warmup_s", "times_s", "seconds", "peak_mib", "rise_mib")
NAMES = {"fastrl": "fastrl trainer update", "fastrl-trl": "FastRLGRPOTrainer", "trl": "trl.GRPOTrainer",
         "eager": "eager (full logits)"}  # fmt: skip
REL_TOL = 1e-4  # gradients of the first timed step: relative L2 over every parameter
LOGP_TOL = 1e-4  # per-token log-probs of the warm-up batch: largest absolute difference
LR = 1e-6


def _meminfo_bytes(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _status_kib(pid, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


# ----------------------------------------------------------------------------- the shared model and batch


def save_model(opts, path: str) -> None:
    """Random Qwen2 weights with Qwen2.5-0.5B's head and width, and a tokenizer, saved to `path`."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=opts.vocab, hidden_size=opts.hidden, intermediate_size=opts.intermediate,
        num_hidden_layers=opts.layers, num_attention_heads=opts.heads, num_key_value_heads=opts.kv_heads,
        max_position_embeddings=max(32768, opts.prompt_length + opts.completion_length), rope_theta=1e6,
        rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=1,
    )  # fmt: skip
    Qwen2ForCausalLM(config).float().save_pretrained(path)
    tok = Tokenizer(models.WordLevel({"<pad>": 0, "<eos>": 1, "<unk>": 2}, unk_token="<unk>"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tokenizer.save_pretrained(path)


def batch(opts, length: int):
    """(prompt ids [P], completion ids [G, length], advantages [G]): fixed, the same in every provider."""
    import torch

    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, opts.vocab, (opts.prompt_length,), generator=g)
    completions = torch.randint(3, opts.vocab, (opts.group, length), generator=g)
    advantages = torch.linspace(1.0, -0.5, opts.group) if opts.group > 1 else torch.ones(1)
    return prompt, completions, advantages


def _load(opts):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(opts.model_dir, dtype=torch.float32, attn_implementation="sdpa")
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return model


# ----------------------------------------------------------------------------- one step per provider


def fastrl_step(opts):
    """(model, step): the trainer's own build and update code, with the math-32k preset's update settings."""
    import torch

    from fastrl.trainer.batching import Sample
    from fastrl.trainer.build import build_model, make_adamw
    from fastrl.trainer.config import make_config
    from fastrl.trainer.update import sequence_logprobs, supports_packing, train_step

    config = make_config(
        preset="math-32k", model=opts.model_dir, max_prompt_length=opts.prompt_length,
        max_completion_length=opts.completion_length, group_size=max(2, opts.group), prompts_per_step=1,
        max_tokens_per_microbatch=opts.budget, eps_high=0.2, lr=LR, device="cpu", bf16=False,
    )  # fmt: skip
    model, tokenizer = build_model(config, torch.device("cpu"))
    packed = config.packing == "on" or (config.packing == "auto" and supports_packing(model))
    optimizer = make_adamw(model.parameters(), config.lr, config.weight_decay, (0.9, config.adam_beta2))

    def samples(length):
        prompt, completions, advantages = batch(opts, length)
        return [Sample(prompt.tolist(), c.tolist(), float(a)) for c, a in zip(completions, advantages)]

    def score(length):  # the trainer's own scoring of the completion tokens
        logp = sequence_logprobs(model, samples(length), config.max_tokens_per_microbatch, packed,
                                 tokenizer.pad_token_id, config.loss.temperature, config.impl, bf16=False)  # fmt: skip
        return torch.tensor(logp)

    def step(length):
        model.train()
        out = train_step(
            model, optimizer, samples(length), config.loss, budget=config.max_tokens_per_microbatch, packed=packed,
            pad_id=tokenizer.pad_token_id, max_grad_norm=config.max_grad_norm, impl=config.impl, bf16=config.bf16,
            log_entropy=config.log_entropy,
        )  # fmt: skip
        return out["loss"]

    return model, optimizer, step, score


def trl_step(opts, fastrl: bool, workdir: str):
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from fastrl.integrations.trl import FastRLGRPOTrainer

    model = _load(opts)
    args = GRPOConfig(
        output_dir=workdir, use_cpu=True, bf16=False, per_device_train_batch_size=opts.group,
        num_generations=opts.group, max_completion_length=opts.completion_length, report_to="none",
        disable_tqdm=True, learning_rate=LR,
    )  # fmt: skip
    cls = FastRLGRPOTrainer if fastrl else GRPOTrainer
    trainer = cls(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                  train_dataset=Dataset.from_dict({"prompt": ["a"] * opts.group}),
                  processing_class=AutoTokenizer.from_pretrained(opts.model_dir))  # fmt: skip
    trainer.current_gradient_accumulation_steps = 1
    optimizer = trainer.create_optimizer()
    params = [p for p in trainer.model.parameters() if p.requires_grad]

    def score(length):  # the trainer's own per-token log-probs (FastRLGRPOTrainer: fastrl's fused head)
        prompt, completions, _ = batch(opts, length)
        ids = torch.cat([prompt.expand(opts.group, -1), completions], dim=1)
        with torch.no_grad():
            logp = trainer._get_per_token_logps_and_entropies(trainer.model, ids, torch.ones_like(ids), length)[0]
        return logp.float()

    def step(length):
        prompt, completions, advantages = batch(opts, length)
        mask = torch.ones_like(completions)
        inputs = {
            "prompt_ids": prompt.expand(opts.group, -1).clone(), "prompt_mask": torch.ones(opts.group,
            opts.prompt_length, dtype=torch.long), "completion_ids": completions, "completion_mask": mask,
            "advantages": advantages, "num_items_in_batch": mask.sum(),
        }  # fmt: skip
        trainer.model.train()
        optimizer.zero_grad(set_to_none=True)
        loss = trainer.compute_loss(trainer.model, inputs)
        trainer.accelerator.backward(loss)
        torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return trainer.model, optimizer, step, score


def eager_step(opts):
    import torch

    from fastrl.trainer.build import make_adamw

    model = _load(opts)
    optimizer = make_adamw(model.parameters(), LR)  # the trainer's (and TRL's default) fused AdamW
    params = [p for p in model.parameters() if p.requires_grad]

    def logprobs(length):
        prompt, completions, _ = batch(opts, length)
        input_ids = torch.cat([prompt.expand(opts.group, -1), completions], dim=1)
        logits = model(input_ids=input_ids, logits_to_keep=length + 1, use_cache=False).logits
        return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)

    def score(length):
        with torch.no_grad():
            return logprobs(length)

    def step(length):
        adv = batch(opts, length)[2].unsqueeze(1)
        model.train()
        logp = logprobs(length)
        ratio = torch.exp(logp - logp.detach())
        loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()  # every token is a completion token
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return model, optimizer, step, score


def child(opts) -> dict:
    import torch

    from bench.harness import rss_peak_bytes

    with tempfile.TemporaryDirectory() as workdir:
        if opts.child == "fastrl":
            model, optimizer, step, score = fastrl_step(opts)
        elif opts.child == "eager":
            model, optimizer, step, score = eager_step(opts)
        else:
            model, optimizer, step, score = trl_step(opts, opts.child == "fastrl-trl", workdir)
        names = {p: n for n, p in model.named_parameters()}
        lrs = [g["lr"] for g in optimizer.param_groups]
        for g in optimizer.param_groups:  # the warm-up step leaves the weights as they are: every provider's
            g["lr"] = 0.0  # first timed step starts from the saved weights, so its gradients compare exactly
        start = time.perf_counter()
        step(opts.warmup_length or opts.completion_length)
        warmup_s = time.perf_counter() - start
        for g, lr in zip(optimizer.param_groups, lrs):
            g["lr"] = lr
        # the per-token log-probs of the warm-up batch under the saved weights, by the provider's own code (untimed)
        torch.save(score(opts.warmup_length or opts.completion_length), logp_path(opts.grads_out))
        saving = []

        def save(opt, *_):  # the clipped gradients the first timed step applies, written out (no copy), untimed
            t0 = time.perf_counter()
            torch.save({names[p]: p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None},
                       opts.grads_out)  # fmt: skip
            saving.append(time.perf_counter() - t0)

        hook = optimizer.register_step_pre_hook(save)
        times, losses = [], []

        def timed():
            for _ in range(opts.steps):
                t0 = time.perf_counter()
                losses.append(step(opts.completion_length))
                times.append(time.perf_counter() - t0 - sum(saving))
                hook.remove()
                saving.clear()

        rss_before = _status_kib("self", "VmRSS") * 1024
        rise = rss_peak_bytes(timed)
    return dict(provider=opts.child, loss=losses[0], warmup_s=warmup_s, times_s=times, seconds=statistics.median(times),
                peak_mib=(rss_before + rise) / 2**20, rise_mib=rise / 2**20)  # fmt: skip


# ----------------------------------------------------------------------------- the parent


def _rel(a, b) -> float:
    return (a.double() - b.double()).norm().item() / max(a.double().norm().item(), 1e-30)


def _watch(proc, cap_bytes: int, hit: list) -> None:
    while proc.poll() is None:
        if _status_kib(proc.pid, "VmRSS") * 1024 > cap_bytes:
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


def logp_path(grads_out: str) -> str:
    return grads_out + ".logp"


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
