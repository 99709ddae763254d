"""`fastrl plot` on synthetic runs: which panels and curves it draws, the PNG it writes, its errors."""

import ast
import json
import math
import pathlib

import pytest

from fastrl.trainer import plot


def _write_run(run_dir: pathlib.Path, steps: int, staleness: bool, torn_tail: bool = False) -> None:
    run_dir.mkdir(parents=True)
    lines = []
    for step in range(1, steps + 1):
        row = {"step": step, "reward_correct_mean": 0.3 + 0.5 * (1 - math.exp(-step / 15)),
               "response_length_mean": 12 - 4 * step / steps, "entropy_mean": 1.2 * math.exp(-step / 30),
               "kl_mean": None if step == 1 else 0.002 * step, "clip_frac_low": 0.01, "clip_frac_high": 0.02,
               "grad_norm": 1 / math.sqrt(step), "tokens_per_s": 900 + 10 * (step % 5), "update_skipped": False,
               "config": {"seed": 0}}  # fmt: skip
        if staleness:
            row |= {"staleness_mean": 0.5 + 0.1 * (step % 3), "staleness_max": 1 + step % 2, "tool_calls_mean": 0.25}
        if step % 10 == 0:
            row |= {"eval_reward_correct_mean": 0.2 + 0.01 * step, "eval_pass@1": 0.2 + 0.01 * step,
                    "eval_pass@2": 0.3 + 0.01 * step}  # fmt: skip
        lines.append(json.dumps(row))
    text = "\n".join(lines) + "\n"
    if torn_tail:
        text += '{"step": 41, "reward_corr'
    (run_dir / "metrics.jsonl").write_text(text)


def test_panels_for_a_plain_run_and_a_run_with_staleness(tmp_path):
    _write_run(tmp_path / "sync", 40, staleness=False)
    _write_run(tmp_path / "async", 30, staleness=True)
    plain = {"sync": plot.series(plot.read_metrics(str(tmp_path / "sync")))}
    assert plain["sync"]["kl_mean"][0][:2] == [2, 3]  # step 1's null is no point
    assert plain["sync"]["eval_pass@1"][0] == [10, 20, 30, 40]
    assert "update_skipped" not in plain["sync"] and "config" not in plain["sync"]
    assert plot.panel_metrics(plain) == [
        ("correctness", ["reward_correct_mean", "eval_reward_correct_mean", "eval_pass@1"]),
        ("response length (tokens)", ["response_length_mean"]),
        ("entropy", ["entropy_mean"]),
        ("KL", ["kl_mean"]),
        ("clip fractions", ["clip_frac_low", "clip_frac_high"]),
        ("gradient norm", ["grad_norm"]),
        ("tokens/s", ["tokens_per_s"]),
    ]  # no staleness or tool-call panel: this run logged neither
    both = {**plain, "async": plot.series(plot.read_metrics(str(tmp_path / "async")))}
    assert plot.panel_metrics(both)[-2:] == [
        ("staleness (versions)", ["staleness_mean", "staleness_max"]),
        ("tool calls", ["tool_calls_mean"]),
    ]
    named = {"r": {"eval_gsm8k_pass@1": ([1], [0.5]), "eval_gsm8k_pass@2": ([1], [0.7])}}
    assert plot.panel_metrics(named)[0] == ("correctness", ["eval_gsm8k_pass@1"])


@pytest.mark.slow  # matplotlib's first import builds its font cache (fc-list) and takes seconds
def test_plot_writes_one_png_of_several_runs(tmp_path):
    _write_run(tmp_path / "sync", 40, staleness=False, torn_tail=True)  # a killed run's torn last line is left out
    _write_run(tmp_path / "async", 30, staleness=True)
    out = tmp_path / "figs" / "both.png"
    assert plot.main([str(tmp_path / "sync"), str(tmp_path / "async"), "--out", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1560, 1080)  # 3 x 3 panels of 5.2 x 3.6 inches at 100 dpi
    assert plot.main([str(tmp_path / "sync")]) == 0
    assert (tmp_path / "sync" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_runs_are_named(tmp_path):
    with pytest.raises(ValueError, match="has no metrics.jsonl"):
        plot.plot_runs([str(tmp_path)], str(tmp_path / "x.png"))
    _write_run(tmp_path / "r", 3, staleness=False)
    with pytest.raises(ValueError, match="must end in .png, got 'x.jpg'"):
        plot.plot_runs([str(tmp_path / "r")], "x.jpg")
    path = tmp_path / "r" / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{not json", lines[2]]) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not JSON"):
        plot.read_metrics(str(tmp_path / "r"))
    with pytest.raises(SystemExit):
        plot.main([str(tmp_path / "missing")])


def test_matplotlib_is_imported_only_inside_plot_runs():
    tree = ast.parse(pathlib.Path(plot.__file__).read_text(encoding="utf-8"))
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names} | {
        n.module for n in top if isinstance(n, ast.ImportFrom)
    }
    assert not {n for n in names if n and n.split(".")[0] == "matplotlib"}, names
