"""Tables (markdown, printed and saved), JSON and PNG plots from a list of `harness.Result`s."""

import json
import os
from collections import defaultdict

from bench.harness import Result

COLORS = {
    "eager": "tab:orange",
    "compile": "tab:blue",
    "fastrl-torch": "tab:green",
    "fastrl-triton": "tab:red",
    "cce": "tab:purple",
    "liger": "tab:brown",
}


TOKEN_KEYS = ("N", "B", "T")  # the keys whose product is the token count


def tokens(shape: dict) -> int:
    """N for token_logprobs shapes, B·T for grpo_loss shapes."""
    return shape["N"] if "N" in shape else shape["B"] * shape["T"]


def fixed_part(shape: dict) -> tuple:
    return tuple((k, v) for k, v in shape.items() if k not in TOKEN_KEYS)


def shape_str(shape: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _baseline(results: list[Result], r: Result, baseline: str) -> Result | None:
    for b in results:
        if (b.op, b.mode, b.shape, b.dtype, b.provider) == (r.op, r.mode, r.shape, r.dtype, baseline) and b.measured:
            return b
    return None


def sweep_table(results: list[Result], baseline: str, gpu: bool) -> str:
    """One markdown table per (op, mode): time with 20/80 quantiles, speed-up and memory vs the baseline."""
    groups = defaultdict(list)
    for r in results:
        groups[(r.op, r.mode)].append(r)
    out = []
    for (op, mode), rows in groups.items():
        out.append(f"\n**{op} — {mode}**\n")
        absent = {r.provider: r.note for r in rows if r.status == "n/a"}
        rows = [r for r in rows if r.status != "n/a"]
        head = [
            "shape",
            "dtype",
            "provider",
            "status",
            "median ms [p20, p80]",
            "× eager",
            "peak extra MiB",
            "eager mem ÷ mem",
        ]
        if gpu:
            head += ["TFLOP/s", "% matmul"]
        head.append("max rel err")
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        for r in rows:
            b = _baseline(results, r, baseline)
            speed = b.median_ms / r.median_ms if b and r.median_ms and b.median_ms else None
            mem = b.extra_mib / r.extra_mib if b and r.extra_mib and b.extra_mib and r.extra_mib > 0 else None
            timing = f"{r.median_ms:.1f} [{r.p20_ms:.1f}, {r.p80_ms:.1f}]" if r.median_ms is not None else "—"
            status = r.status if not r.note else f"{r.status}: {r.note}"
            cells = [
                shape_str(r.shape),
                r.dtype,
                r.provider,
                status,
                timing,
                _fmt(speed, ".2f"),
                _fmt(r.extra_mib, ".0f"),
                _fmt(mem, ".1f"),
            ]
            if gpu:
                cells += [_fmt(r.tflops, ".0f"), _fmt(r.pct_ceiling, ".0f")]
            cells.append(_fmt(max(r.errors.values()) if r.errors else None, ".1e"))
            out.append("| " + " | ".join(cells) + " |")
        if absent:
            out.append("\nnot run here: " + "; ".join(f"{p} ({why})" for p, why in absent.items()))
    return "\n".join(out)


def memory_scaling_table(results: list[Result], op: str, mode: str, providers: list[str]) -> str:
    """Peak extra memory vs N at fixed (D, V): O(N·V) for eager against O(N) for fastrl."""
    rows = [r for r in results if r.op == op and r.mode == mode and r.provider in providers]
    by_dv = defaultdict(dict)
    for r in rows:
        by_dv[fixed_part(r.shape)].setdefault(tokens(r.shape), {})[r.provider] = r
    out = []
    for dv, by_n in by_dv.items():
        out.append(
            f"\n**peak extra memory (MiB, beyond the gradients) vs N tokens (B·T for grpo_loss) — {op} {mode}, "
            f"{' '.join(f'{k}={v}' for k, v in dv)}**\n"
        )
        head = ["N"] + providers + [f"{providers[0]} ÷ {p}" for p in providers[1:]]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        for n in sorted(by_n):
            cells = [str(n)]
            mib = {}
            for p in providers:
                r = by_n[n].get(p)
                if r is None:
                    cells.append("—")
                elif r.measured and r.extra_mib is not None:
                    mib[p] = r.extra_mib
                    cells.append(f"{r.extra_mib:.0f}")
                else:
                    cells.append(r.status)
            for p in providers[1:]:
                ok = providers[0] in mib and p in mib and mib[p] > 0
                cells.append(f"{mib[providers[0]] / mib[p]:.1f}×" if ok else "—")
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def write_json(path: str, env: dict, results: list[Result]) -> None:
    with open(path, "w") as f:
        json.dump({"environment": env, "results": [r.to_json() for r in results]}, f, indent=1)


def plot(results: list[Result], out_dir: str, tag: str) -> list[str]:
    """time vs N and peak extra memory vs N, one line per provider, one PNG per (op, mode, D, V, dtype)."""
    try:
        import matplotlib
    except ImportError:  # e.g. a GPU machine with a bare stack: the tables and JSON are still written
        print("[bench] matplotlib is not installed: no plots")
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = defaultdict(lambda: defaultdict(list))
    for r in results:
        if not r.measured:
            continue
        rest = "_".join(f"{k}{v}" for k, v in fixed_part(r.shape))
        series[(r.op, r.mode, rest, r.dtype)][r.provider].append(r)
    paths = []
    for (op, mode, rest, dtype), by_provider in series.items():
        if max(len(v) for v in by_provider.values()) < 2:
            continue  # one point is a table entry, not a curve
        measured_memory = any(r.extra_mib is not None for rows in by_provider.values() for r in rows)
        # no memory column (e.g. --quick, or the fwd mode) gets no empty memory panel
        fig, axes = plt.subplots(1, 2 if measured_memory else 1, figsize=(11 if measured_memory else 6, 4))
        ax_t, ax_m = (axes[0], axes[1]) if measured_memory else (axes, None)
        for provider, rows in sorted(by_provider.items()):
            rows.sort(key=lambda r: tokens(r.shape))
            ns = [tokens(r.shape) for r in rows]
            color = COLORS.get(provider, "tab:gray")
            ax_t.plot(ns, [r.median_ms for r in rows], marker="o", label=provider, color=color)
            ax_t.fill_between(ns, [r.p20_ms for r in rows], [r.p80_ms for r in rows], alpha=0.2, color=color)
            mem = [(tokens(r.shape), r.extra_mib) for r in rows if r.extra_mib is not None]
            if mem:
                ax_m.plot(*zip(*mem), marker="o", label=provider, color=color)
        for ax, label in ((ax_t, "median time, ms (band: p20–p80)"), (ax_m, "peak extra memory, MiB")):
            if ax is None or not ax.lines:
                continue
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("tokens (N = B·T)")
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        fig.suptitle(f"{op} {mode}, {rest.replace('_', ' ')}, {dtype} — {tag}")
        fig.tight_layout()
        path = os.path.join(out_dir, f"{op}_{mode.replace('+', '_')}_{rest}_{dtype}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths
