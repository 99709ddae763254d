"""Experiment trackers behind `--report-to`: TensorBoard, Weights & Biases, MLflow (a comma list, or `none`).

The loop opens them once, logs each step's row, and closes them at the end:

    trackers = open_trackers(parse_report_to("wandb,mlflow"), output_dir, rank=rank, run_name=..., project=...,
                             resume_step=None or the checkpoint's step, config=run config as a flat dict)
    trackers.log(row, step)      # every finite number of the row but `step`; None, bools, text, dicts are skipped
    trackers.close()

Only rank 0 logs: on any other rank `open_trackers` imports and opens nothing and `log` does nothing. A tracker's
package is imported when it is opened, not before; a missing one is a ValueError naming the extra to install
(`pip install "fastrl[wandb]"`).

Where each run goes, and what resume does (`resume_step` set):
    tensorboard  <output_dir>/tensorboard; on resume the events after `resume_step` (logged by the run that was
                 killed after its last checkpoint) are purged, so every step holds the resumed run's value.
    wandb        project `project` (default "fastrl"), run `run_name`, files under <output_dir>/wandb; the mode
                 (online / offline) is W&B's own (`WANDB_MODE`). Its run id is kept in <output_dir>/trackers.json
                 and a resume continues that run (`resume="allow"`). W&B ignores a step lower than the run's
                 current one, so steps the killed run logged after its checkpoint keep that run's values.
    mlflow       the tracking URI `MLFLOW_TRACKING_URI`, else a SQLite store <output_dir>/mlflow.db; experiment
                 `project` (default "fastrl"), run `run_name`; the run id is kept in <output_dir>/trackers.json
                 and a resume reopens that run, its metrics' histories continuing (steps the killed run logged
                 after its checkpoint hold both runs' values).
A resume with no stored run id (the tracker was not on before) starts a new tracker run.

Metric names: MLflow accepts letters, digits, `_ - . /` and spaces, so `@` becomes `_at_` there
(`eval_pass@4` -> `eval_pass_at_4`); TensorBoard and W&B get the names as they are in `metrics.jsonl`.
"""

import importlib
import json
import math
import os
import time

TRACKERS = ("tensorboard", "wandb", "mlflow")
_MODULES = {"tensorboard": "torch.utils.tensorboard", "wandb": "wandb", "mlflow": "mlflow"}  # what each imports
_STATE_FILE = "trackers.json"


def parse_report_to(value: str) -> tuple[str, ...]:
    """`--report-to` as tracker names: "none" -> (); "tensorboard,wandb" -> ("tensorboard", "wandb")."""
    if not isinstance(value, str):
        raise TypeError(f"--report-to must be a str, got {type(value).__name__}: {value!r}")
    names = [v.strip() for v in value.split(",")]
    if names == ["none"]:
        return ()
    for name in names:
        if name not in TRACKERS:
            raise ValueError(f"--report-to: unknown tracker {name!r} in {value!r}; choose from {TRACKERS} or 'none'")
    if len(set(names)) != len(names):
        raise ValueError(f"--report-to names a tracker twice: {value!r}")
    return tuple(names)


def check_installed(names: tuple[str, ...]) -> None:
    """Import each tracker's package now (before a model is built); a missing one is a ValueError naming its extra."""
    for name in names:
        _import(name)


def mlflow_name(name: str) -> str:
    """A metric name as MLflow accepts it: `@` -> `_at_`."""
    return name.replace("@", "_at_")


def _import(tracker: str):
    try:
        return importlib.import_module(_MODULES[tracker])
    except ImportError as e:
        raise ValueError(f'--report-to {tracker} needs the {tracker} package: pip install "fastrl[{tracker}]"') from e


def _scalars(row: dict) -> dict[str, float]:
    out = {}
    for key, value in row.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


class _TensorBoard:
    def __init__(self, output_dir: str, run_name, project, resume_step, config, stored: dict):
        writer_class = _import("tensorboard").SummaryWriter
        purge = None if resume_step is None else resume_step + 1
        self.writer = writer_class(os.path.join(output_dir, "tensorboard"), purge_step=purge)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()

    def state(self) -> dict:
        return {}


class _Wandb:
    def __init__(self, output_dir: str, run_name, project, resume_step, config, stored: dict):
        wandb = _import("wandb")
        run_id = stored.get("run_id") if resume_step is not None else None
        self.run = wandb.init(project=project or "fastrl", name=run_name, dir=output_dir, config=config, id=run_id,
                              resume="allow" if run_id else None)  # fmt: skip

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()

    def state(self) -> dict:
        return {"run_id": self.run.id}


class _Mlflow:
    def __init__(self, output_dir: str, run_name, project, resume_step, config, stored: dict):
        _import("mlflow")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self._metric = Metric
        default_uri = "sqlite:///" + os.path.abspath(os.path.join(output_dir, "mlflow.db"))
        uri = os.environ.get("MLFLOW_TRACKING_URI") or default_uri
        self.client = MlflowClient(tracking_uri=uri)
        run_id = stored.get("run_id") if resume_step is not None else None
        if run_id is not None:
            self.client.update_run(run_id, status="RUNNING")
            self.run_id = run_id
            return
        name = project or "fastrl"
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        params = [Param(k, str(v)) for k, v in (config or {}).items() if not isinstance(v, (dict, list))]
        if params:
            self.client.log_batch(self.run_id, params=params)

    def log(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        batch = [self._metric(mlflow_name(k), v, now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)

    def state(self) -> dict:
        return {"run_id": self.run_id}


_CLASSES = {"tensorboard": _TensorBoard, "wandb": _Wandb, "mlflow": _Mlflow}


class Trackers:
    """The open trackers of a run (none on ranks other than 0): `log(row, step)` to all, `close()`."""

    def __init__(self, trackers: dict):
        self.trackers = trackers

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.trackers)

    def log(self, row: dict, step: int) -> None:
        """Log the finite numbers of `row` (one `metrics.jsonl` line) at `step` to every open tracker."""
        if not self.trackers:
            return
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        metrics = _scalars(row)
        for tracker in self.trackers.values():
            tracker.log(metrics, step)

    def close(self) -> None:
        for tracker in self.trackers.values():
            tracker.close()
        self.trackers = {}


def open_trackers(names: tuple[str, ...], output_dir: str, *, rank: int, run_name: str | None = None,
                  project: str | None = None, resume_step: int | None = None,
                  config: dict | None = None) -> Trackers:  # fmt: skip
    """Open the trackers `names` (from `parse_report_to`) for the run in `output_dir` on rank 0.

    Args:
        names: tracker names, each in TRACKERS.
        output_dir: the run's output directory (tracker files and trackers.json go there).
        rank: this process's global rank; only rank 0 opens anything.
        run_name: the tracker run's display name (W&B, MLflow); None lets the tracker pick one.
        project: W&B project / MLflow experiment; None means "fastrl".
        resume_step: the checkpoint step a resumed run starts after; None for a fresh run.
        config: the run's settings (W&B config, MLflow params of a new run); flat values.
    Returns:
        Trackers: empty on ranks other than 0 and for names == ().
    """
    for name in names:
        if name not in TRACKERS:
            raise ValueError(f"unknown tracker {name!r}; choose from {TRACKERS}")
    if not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an int >= 0, got {rank!r}")
    if rank != 0 or not names:
        return Trackers({})
    state_path = os.path.join(output_dir, _STATE_FILE)
    stored = {}
    if os.path.exists(state_path):  # kept whole: a tracker not on in this run keeps its id for a later resume
        with open(state_path, encoding="utf-8") as f:
            stored = json.load(f)
    os.makedirs(output_dir, exist_ok=True)
    opened = {}
    try:
        for name in names:
            opened[name] = _CLASSES[name](output_dir, run_name, project, resume_step, config, stored.get(name, {}))
    except BaseException:
        Trackers(opened).close()
        raise
    state = {**stored, **{name: tracker.state() for name, tracker in opened.items() if tracker.state()}}
    tmp = state_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f)
    os.replace(tmp, state_path)
    return Trackers(opened)
