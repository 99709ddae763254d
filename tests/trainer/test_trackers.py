"""Each tracker run for real, offline, and read back: TensorBoard through its event reader, MLflow from a local
SQLite store, W&B from the `.wandb` file of an offline run (parsed here: LevelDB-log blocks of
`wandb_internal_pb2.Record`s). The values read back are compared with `metrics.jsonl`; only rank 0 logs; a
tracker's package is imported only when asked for, and a missing one names its extra."""

import glob
import json
import math
import struct
import sys
import time
import zlib

import pytest

from fastrl.trainer import trackers
from fastrl.trainer.metrics import MetricsLogger

ROWS = [
    {"step": 1, "loss": 0.5, "reward_correct_mean": 0.25, "eval_pass@2": 0.75, "kl_mean": float("nan"),
     "update_skipped": False, "lr": 1e-6, "rollout_tokens": 1234, "config": {"seed": 0}},
    {"step": 2, "loss": -0.125, "reward_correct_mean": 0.5, "kl_mean": 0.01, "update_skipped": False, "lr": 2e-6,
     "rollout_tokens": 1500},
    {"step": 3, "loss": 0.0625, "reward_correct_mean": 0.625, "eval_pass@2": 0.875, "kl_mean": 0.02,
     "update_skipped": True, "lr": 3e-6, "rollout_tokens": 1700},
]  # fmt: skip
RESUMED_STEP_3 = {"step": 3, "loss": 0.03125, "reward_correct_mean": 0.75, "lr": 3e-6, "rollout_tokens": 1800}


def _log_through_metrics_jsonl(out, rows, resume_step, names):
    """Log `rows` as the loop does: metrics.jsonl and the trackers; returns metrics.jsonl's rows."""
    logger = MetricsLogger(str(out), resume_step)
    run = trackers.open_trackers(names, str(out), rank=0, run_name="r1", project="fastrl-test",
                                 resume_step=resume_step, config={"seed": 0, "lr": 1e-6})  # fmt: skip
    for row in rows:
        logger.log(row)
        run.log(row, row["step"])
    run.close()
    logger.close()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _expected(jsonl_rows) -> dict[str, dict[int, float]]:
    """metric -> {step: value}: the finite numbers of each row but step (bools are not metrics)."""
    out = {}
    for row in jsonl_rows:
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                out.setdefault(key, {})[row["step"]] = float(value)
    return out


def test_report_to_parses_a_comma_list_and_names_bad_values():
    assert trackers.parse_report_to("none") == ()
    assert trackers.parse_report_to("tensorboard, wandb,mlflow") == ("tensorboard", "wandb", "mlflow")
    with pytest.raises(ValueError, match="unknown tracker 'comet'"):
        trackers.parse_report_to("wandb,comet")
    with pytest.raises(ValueError, match="unknown tracker 'none'"):
        trackers.parse_report_to("wandb,none")
    with pytest.raises(ValueError, match="twice"):
        trackers.parse_report_to("wandb,wandb")
    assert trackers.mlflow_name("eval_gsm8k_pass@4") == "eval_gsm8k_pass_at_4"


def test_only_rank_0_logs(tmp_path, monkeypatch):
    for module in ("wandb", "mlflow"):
        monkeypatch.setitem(sys.modules, module, None)  # importing it would fail: rank 1 must not
    run = trackers.open_trackers(trackers.TRACKERS, str(tmp_path / "r1"), rank=1)
    run.log(ROWS[0], 1)
    run.close()
    assert run.names == () and not (tmp_path / "r1").exists()
    run = trackers.open_trackers(("tensorboard",), str(tmp_path / "r0"), rank=0)
    run.log(ROWS[0], 1)
    run.close()
    assert glob.glob(str(tmp_path / "r0" / "tensorboard" / "events.out.tfevents.*"))


@pytest.mark.parametrize("name", trackers.TRACKERS)
def test_a_missing_package_names_its_extra(tmp_path, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ImportError
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)  # re-imported: it imports tensorboard
    message = rf'--report-to {name} needs the {name} package: pip install "fastrl\[{name}\]"'
    with pytest.raises(ValueError, match=message):
        trackers.open_trackers((name,), str(tmp_path), rank=0)


def test_tensorboard_reads_back_and_a_resume_purges_the_killed_runs_later_steps(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for module in ("wandb", "mlflow"):
        monkeypatch.setitem(sys.modules, module, None)  # tensorboard alone imports neither
    first = _log_through_metrics_jsonl(tmp_path, ROWS, None, ("tensorboard",))
    rows = _log_through_metrics_jsonl(tmp_path, [RESUMED_STEP_3], 2, ("tensorboard",))
    assert rows == first[:2] + [RESUMED_STEP_3]
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    logged = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    expected = _expected(rows)
    assert logged.keys() == expected.keys()
    for tag, values in expected.items():
        assert logged[tag] == pytest.approx(values, rel=1e-6), tag  # float32 events


@pytest.mark.slow  # MLflow runs `uname` and takes ~10 s to set up its store
def test_mlflow_reads_back_from_a_sqlite_store_and_a_resume_continues_the_run(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from mlflow.tracking import MlflowClient

    first = _log_through_metrics_jsonl(tmp_path, ROWS[:2], None, ("mlflow",))
    run_id = json.loads((tmp_path / "trackers.json").read_text())["mlflow"]["run_id"]
    rows = _log_through_metrics_jsonl(tmp_path, [ROWS[2]], 2, ("mlflow",))
    assert rows == first + [ROWS[2]]
    assert json.loads((tmp_path / "trackers.json").read_text())["mlflow"]["run_id"] == run_id  # the same run
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.info.run_name == "r1" and run.info.status == "FINISHED" and run.data.params["seed"] == "0"
    assert client.get_experiment(run.info.experiment_id).name == "fastrl-test"
    expected = _expected(rows)
    assert set(run.data.metrics) == {trackers.mlflow_name(k) for k in expected}
    for key, values in expected.items():
        history = client.get_metric_history(run_id, trackers.mlflow_name(key))
        assert {m.step: m.value for m in history} == values, key


def _wandb_records(path: str):
    """The `Record`s of a `.wandb` file: a 7-byte header (":W&B", magic, version), then 32 KiB blocks of
    LevelDB-log records (crc32 of type + data, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    offset, pending = 7, b""
    while offset + 7 <= len(data):
        left = 32768 - offset % 32768
        if left < 7:  # a block's tail too short for a record header is padding
            offset += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[offset : offset + 7])
        if (crc, length, kind) == (0, 0, 0):
            break
        if offset + 7 + length > len(data):
            break  # a record still being written
        chunk = data[offset + 7 : offset + 7 + length]
        assert zlib.crc32(bytes([kind]) + chunk) == crc, f"bad checksum at byte {offset} of {path}"
        offset += 7 + length
        pending += chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""


def _wandb_history(path: str, timeout: float = 60.0) -> tuple[str, dict[str, dict[int, float]]]:
    """The run id and metric -> {step: value} of a finished run's file. W&B's core process may still be writing
    it when `finish()` returns: wait (up to `timeout` s) for the run's exit record."""
    deadline = time.monotonic() + timeout
    while not any(r.WhichOneof("record_type") == "exit" for r in _wandb_records(path)):
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout} s"
        time.sleep(0.1)
    run_id, out = None, {}
    for record in _wandb_records(path):
        if record.WhichOneof("record_type") == "run":
            run_id = record.run.run_id
        if record.WhichOneof("record_type") == "history":
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):
                    out.setdefault(key, {})[record.history.step.num] = json.loads(item.value_json)
    return run_id, out


@pytest.mark.slow  # W&B starts its core process
def test_wandb_offline_reads_back_and_a_resume_continues_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    first = _log_through_metrics_jsonl(tmp_path, ROWS[:2], None, ("wandb",))
    (first_file,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    run_id, logged = _wandb_history(first_file)
    assert run_id == json.loads((tmp_path / "trackers.json").read_text())["wandb"]["run_id"]
    assert logged == _expected(first)
    rows = _log_through_metrics_jsonl(tmp_path, [ROWS[2]], 2, ("wandb",))
    (second_file,) = set(glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))) - {first_file}
    resumed_id, resumed = _wandb_history(second_file)
    assert resumed_id == run_id  # the same W&B run, continued
    assert resumed == {k: {3: v[3]} for k, v in _expected(rows).items() if 3 in v}
    assert all(math.isfinite(v) for values in logged.values() for v in values.values())
