"""What a run reports besides metrics.jsonl: its trackers (`--report-to`, `--run-name`, `--project`) and its
curves (`--plot`). One short tiny run, resumed once, is shared by the slow checks; each tracker is read back with
its own reader and compared with metrics.jsonl, row by row."""

import json
import os
import sys

import pytest
from test_trackers import _expected

import fastrl.trainer.trainer as trainer_module
from fastrl.trainer.cli import main
from fastrl.trainer.config import make_config
from fastrl.trainer.metrics import read_metrics
from fastrl.trainer.sources import SyncSource
from fastrl.trainer.trackers import mlflow_name

TINY = ["train", "--preset", "tiny", "--warmup-sft-steps", "5", "--prompts-per-step", "4", "--group-size", "4",
        "--no-progress", "--log-every", "0", "--report-to", "tensorboard,mlflow", "--run-name", "tiny-run",
        "--project", "fastrl-reporting"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """Two steps and a checkpoint, then `--resume` to a third: (output dir, the MLflow run id after each part)."""
    out = tmp_path_factory.mktemp("tiny")
    ids = []
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        for extra in (["--max-steps", "2", "--save-steps", "2"], ["--max-steps", "3", "--resume"]):
            assert main([*TINY, "--output-dir", str(out), *extra]) == 0
            ids.append(json.loads((out / "trackers.json").read_text())["mlflow"]["run_id"])
    return out, ids


@pytest.mark.slow
def test_tensorboard_holds_the_metrics_jsonl_rows(tiny_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = tiny_run
    rows = read_metrics(str(out))
    assert [r["step"] for r in rows] == [1, 2, 3]
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    logged = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    expected = _expected(rows)
    assert logged.keys() == expected.keys() and "reward_correct_mean" in logged
    for tag, values in expected.items():
        assert logged[tag] == pytest.approx(values, rel=1e-6), tag  # float32 events


@pytest.mark.slow
def test_mlflow_run_is_named_and_continued_on_resume(tiny_run):
    from mlflow.tracking import MlflowClient

    out, ids = tiny_run
    assert ids[0] == ids[1]  # the resume reopened the first part's run
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    run = client.get_run(ids[0])
    assert run.info.run_name == "tiny-run" and run.info.status == "FINISHED" and run.data.params["seed"] == "0"
    assert client.get_experiment(run.info.experiment_id).name == "fastrl-reporting"
    for key, values in _expected(read_metrics(str(out))).items():
        history = client.get_metric_history(ids[0], mlflow_name(key))
        assert {m.step: m.value for m in history} == values, key


def test_tensorboard_flag_adds_the_tracker():
    assert make_config("tiny").trackers == ()
    assert make_config("tiny", tensorboard=True).trackers == ("tensorboard",)
    assert make_config("tiny", report_to="mlflow", tensorboard=True).trackers == ("mlflow", "tensorboard")
    assert make_config("tiny", report_to="tensorboard", tensorboard=True).trackers == ("tensorboard",)


@pytest.mark.parametrize("value", ["comet", "wandb,wandb", "none,wandb", ""])
def test_bad_report_to_is_refused_by_name(value, capsys):
    assert main(["train", "--preset", "tiny", "--report-to", value, "--print-config"]) == 2
    err = capsys.readouterr().err
    assert f"--report-to {value}: must be none or a comma list of tensorboard, wandb, mlflow" in err, err


class _Recorder:
    def __init__(self):
        self.rows, self.closed = [], False

    def log(self, row, step):
        self.rows.append((step, row["step"]))

    def close(self):
        self.closed = True


def test_the_loop_logs_each_row_and_closes_the_trackers_on_an_exception(tmp_path, monkeypatch):
    recorder, opened = _Recorder(), []

    def fake_open(names, output_dir, **kwargs):
        opened.append((names, output_dir, kwargs["rank"], kwargs["resume_step"], kwargs["run_name"]))
        return recorder

    calls = []

    def next_batch(self, step):
        calls.append(step)
        if len(calls) == 2:
            raise RuntimeError("the second batch fails")
        return original(self, step)

    original = SyncSource.next_batch
    monkeypatch.setattr(trainer_module, "open_trackers", fake_open)
    monkeypatch.setattr(SyncSource, "next_batch", next_batch)
    config = make_config("tiny", output_dir=str(tmp_path), warmup_sft_steps=0, prompts_per_step=2, group_size=2,
                         max_steps=3, progress=False, log_every=0, report_to="tensorboard", run_name="r",
                         plot=False)  # fmt: skip
    with pytest.raises(RuntimeError, match="the second batch fails"):
        trainer_module.train(config)
    assert opened == [(("tensorboard",), str(tmp_path), 0, None, "r")]
    assert recorder.rows == [(1, 1)] and recorder.closed
    assert os.path.exists(tmp_path / "metrics.jsonl")


@pytest.mark.slow
def test_the_tiny_run_draws_its_curves(tiny_run):
    import matplotlib.image

    out, _ = tiny_run
    assert matplotlib.image.imread(out / "curves.png").ndim == 3  # a PNG, written at the end of the run


def test_plot_is_on_for_the_tiny_preset_only():
    assert make_config("tiny").plot and not make_config().plot and not make_config("math-32k").plot
    assert not make_config("tiny", plot=False).plot


def test_fastrl_plot_draws_a_metrics_jsonl(tmp_path, capsys):
    import matplotlib.image

    rows = [{"step": s, "reward_correct_mean": s / 4, "loss": 0.5 - s / 10, "entropy_mean": 1.0} for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["plot", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "curves.png")
    assert matplotlib.image.imread(tmp_path / "curves.png").ndim == 3
    assert main(["plot", str(tmp_path), str(tmp_path), "--out", str(tmp_path / "two.png")]) == 0
    assert (tmp_path / "two.png").exists()
    with pytest.raises(SystemExit) as e:
        main(["plot", str(tmp_path / "missing")])
    assert e.value.code == 2 and "has no metrics.jsonl" in capsys.readouterr().err


def test_plot_without_matplotlib_is_refused_before_the_model(tmp_path, monkeypatch, capsys):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else find_spec(name, *a)
    )
    assert main(["train", "--preset", "tiny", "--output-dir", str(tmp_path / "run"), "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "--plot" in err or "plot=True" in err, err
    assert "--no-plot" in err and "matplotlib" in err and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_tracker_that_is_not_installed_is_refused_before_the_model(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    out = tmp_path / "run"
    args = ["train", "--preset", "tiny", "--output-dir", str(out), "--report-to", "wandb", "--warmup-sft-steps", "0",
            "--max-steps", "1", "--no-progress"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert 'fastrl: error: --report-to wandb needs the wandb package: pip install "fastrl[wandb]"\n' in err, err
    assert not (out / "metrics.jsonl").exists()
