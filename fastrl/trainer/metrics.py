"""`metrics.jsonl` (one JSON object per optimizer step), the same rows to the trackers, and the progress line.

On resume the log is cut back to the checkpoint's step: lines of later steps (logged after the checkpoint
by the run that was killed), duplicates and a torn last line are dropped, so every step appears once.
"""

import json
import math
import os


def _read_steps(path: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line torn by a kill mid-write
    return rows


def truncate_log(path: str, last_step: int) -> int:
    """Keep the first record of each step <= last_step, in order; atomically rewrite. Returns records kept."""
    if not os.path.exists(path):
        return 0
    seen, kept = set(), []
    for row in _read_steps(path):
        step = row.get("step")
        if isinstance(step, int) and step <= last_step and step not in seen:
            seen.add(step)
            kept.append(row)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    os.replace(tmp, path)
    return len(kept)


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; null says "not available"
    return value


class MetricsLogger:
    """Appends one line per step to <output_dir>/metrics.jsonl and logs the same row to the run's trackers
    (`trackers.open_trackers`; rank 0 only: other ranks get a no-op)."""

    def __init__(self, output_dir: str, resume_step: int | None, enabled: bool = True, trackers=None):
        self.enabled = enabled
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self.trackers = trackers
        if not enabled:
            return
        os.makedirs(output_dir, exist_ok=True)
        if resume_step is not None:
            truncate_log(self.path, resume_step)
        elif os.path.exists(self.path):
            os.remove(self.path)  # a fresh run starts a fresh log
        self.file = open(self.path, "a", encoding="utf-8")

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        record = {k: _clean(v) for k, v in record.items()}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()  # in the kernel's page cache: survives a SIGKILL of this process
        if self.trackers is not None:
            self.trackers.log(record, record["step"])

    def close(self) -> None:
        """Close the file and the trackers (once; also after an exception in the loop)."""
        if self.enabled and not self.file.closed:
            self.file.close()
        if self.trackers is not None:
            self.trackers.close()


def read_metrics(output_dir: str) -> list[dict]:
    return _read_steps(os.path.join(output_dir, "metrics.jsonl"))


def progress_line(record: dict, max_steps: int) -> str:
    """One line of a step's main metrics, for runs without a progress bar (logs, CI, nohup)."""
    parts = [f"step {record['step']}/{max_steps}"]
    for key, label, fmt in (
        ("reward_correct_mean", "correct", ".3f"),
        ("reward_mean", "reward", ".3f"),
        ("loss", "loss", ".4g"),
        ("kl_mean", "kl", ".3g"),
        ("entropy_mean", "entropy", ".3f"),
        ("tokens_per_s", "tok/s", ".0f"),
        ("elapsed_s", "elapsed_s", ".1f"),
    ):
        value = record.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            parts.append(f"{label} {value:{fmt}}")
    return "  ".join(parts)
