"""`fastrl plot RUN_DIR [RUN_DIR ...] [--out FILE.png]`: a run's curves, or several runs' overlaid, as one PNG.

Each run directory's `metrics.jsonl` (one row per optimizer step) is read and every panel is drawn against step:

    correctness        train `reward_correct_mean`; eval `eval_[<set>_]reward_correct_mean` and `..._pass@1`
    response length    train `response_length_mean`; eval `eval_[<set>_]response_length_mean`
    entropy            `entropy_mean`
    KL                 `kl_mean`
    clip fractions     `clip_frac_low`, `clip_frac_high`
    gradient norm      `grad_norm`
    tokens/s           `tokens_per_s`
    staleness          `staleness_mean`, `staleness_max`            (only when a run logged them)
    tool calls         every `tool_calls...` metric                  (only when a run logged one)

Runs keep one colour each (the legend names them by directory); a panel's metrics differ by line style. A value
that is null on a row (not available that step) is no point; eval metrics are points on their eval steps.
matplotlib is imported only here, inside `plot_runs`.
"""

import argparse
import json
import os
import re

_EVAL = r"eval_(?:[A-Za-z0-9][A-Za-z0-9_.-]*_)?"
PANELS = (  # (title, metric-name patterns, drawn even when no run logged it)
    ("correctness", (r"reward_correct_mean", _EVAL + r"reward_correct_mean", _EVAL + r"pass@1"), True),
    ("response length (tokens)", (r"response_length_mean", _EVAL + r"response_length_mean"), True),
    ("entropy", (r"entropy_mean",), True),
    ("KL", (r"kl_mean",), True),
    ("clip fractions", (r"clip_frac_low", r"clip_frac_high"), True),
    ("gradient norm", (r"grad_norm",), True),
    ("tokens/s", (r"tokens_per_s",), True),
    ("staleness (versions)", (r"staleness_mean", r"staleness_max"), False),
    ("tool calls", (r"tool_calls\w*",), False),
)
_STYLES = ("-", "--", ":", "-.")


def read_metrics(run_dir: str) -> list[dict]:
    """The rows of `<run_dir>/metrics.jsonl` (a torn last line, from a killed run, is left out)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise ValueError(f"{run_dir!r} is not a run directory: it has no metrics.jsonl")
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    rows = []
    for lineno, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if lineno == len(lines):
                break  # the last line, cut by a kill mid-write
            raise ValueError(f"{path}:{lineno} is not JSON: {e}") from e
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise ValueError(f"{path}:{lineno} is not a metrics row with an int `step`: {line[:80]!r}")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no rows")
    return rows


def series(rows: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """metric -> (steps, values) over the rows where the metric is a number (bools and nulls left out)."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for row in rows:
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                steps, values = out.setdefault(key, ([], []))
                steps.append(row["step"])
                values.append(float(value))
    return out


def panel_metrics(runs: dict[str, dict]) -> list[tuple[str, list[str]]]:
    """The panels to draw for these runs' series: (title, the metric names any run logged, in pattern order)."""
    logged = sorted({key for run in runs.values() for key in run})
    out = []
    for title, patterns, always in PANELS:
        names = [k for p in patterns for k in logged if re.fullmatch(p, k)]
        if names or always:
            out.append((title, names))
    return out


def _labels(run_dirs: list[str]) -> list[str]:
    names = [os.path.basename(os.path.normpath(d)) for d in run_dirs]
    return names if len(set(names)) == len(names) else [os.path.normpath(d) for d in run_dirs]


def plot_runs(run_dirs: list[str], out_png: str) -> str:
    """Draw the runs in `run_dirs` into one figure at `out_png` (PNG); returns `out_png`."""
    if not run_dirs:
        raise ValueError("plot_runs needs at least one run directory")
    if not out_png.endswith(".png"):
        raise ValueError(f"the figure is written as PNG: out_png must end in .png, got {out_png!r}")
    runs = {label: series(read_metrics(d)) for label, d in zip(_labels(run_dirs), run_dirs)}
    try:
        import matplotlib
    except ImportError as e:
        raise ValueError('`fastrl plot` needs matplotlib: pip install "fastrl[test]" or pip install matplotlib') from e
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    panels = panel_metrics(runs)
    ncols = 3
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.6 * nrows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, names) in zip(axes.flat, panels):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        drawn = False
        for r, (label, run) in enumerate(runs.items()):
            for m, name in enumerate(names):
                if name in run:
                    steps, values = run[name]
                    marker = "o" if name.startswith("eval_") else None
                    ax.plot(steps, values, _STYLES[m % len(_STYLES)], color=colors[r % len(colors)], marker=marker,
                            markersize=4, label=f"{label}: {name}" if len(runs) > 1 else name)  # fmt: skip
                    drawn = True
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(", ".join(runs))
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png


def main(argv: list[str] | None = None) -> int:
    """`fastrl plot RUN_DIR [RUN_DIR ...] [--out FILE.png]`; the figure goes to `<RUN_DIR>/curves.png` for one
    run, `curves.png` for several, unless `--out` says where."""
    parser = argparse.ArgumentParser(prog="fastrl plot", description="Draw runs' metrics.jsonl against step.")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a run's output directory")
    parser.add_argument("--out", metavar="FILE.png", help="where the PNG goes")
    args = parser.parse_args(argv)
    out = args.out or (os.path.join(args.run_dirs[0], "curves.png") if len(args.run_dirs) == 1 else "curves.png")
    try:
        print(plot_runs(args.run_dirs, out))
    except ValueError as e:
        parser.error(str(e))
    return 0
