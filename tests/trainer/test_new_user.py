"""The paths a new user takes first: the real `fastrl` command line, a reused output directory, a corrupt
checkpoint, a custom reward from their own module, the log of a run without a progress bar.

Every command runs `python -m fastrl.trainer` in a subprocess (the console script's entry point), with
this checkout first on PYTHONPATH.
"""

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test here starts processes (workers, a CLI, a venv)

ROOT = Path(__file__).resolve().parents[2]
# a run of a few seconds on the built-in tiny model: no warm-up, 2 prompts x 2 completions, short answers
FAST = ["--preset", "tiny", "--warmup-sft-steps", "0", "--prompts-per-step", "2", "--group-size", "2",
        "--max-completion-length", "4", "--no-progress"]  # fmt: skip


def fastrl(*args, cwd, env=None, timeout=300):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "OMP_NUM_THREADS": "1", **(env or {})}  # fmt: skip
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "fastrl.trainer", *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    proc.wall_s = time.time() - t0
    return proc


def metrics_steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


BAD_FLAGS = [
    (["--loss-agg", "foo"], "--loss-agg", "foo"),
    (["--kl", "k9"], "--kl", "k9"),
    (["--rewards", "nonsense:1"], "--rewards", "nonsense"),
    (["--rewards", "accuracy:heavy"], "--rewards", "heavy"),
    (["--rewards", "my_rewards_missing_module:fn:0.5"], "--rewards", "my_rewards_missing_module"),
    (["--eps-low", "1.5"], "--eps-low", "1.5"),
    (["--dual-clip", "0.5"], "--dual-clip", "0.5"),
    (["--lr", "-1"], "--lr", "-1"),
    (["--lr", "fast"], "--lr", "fast"),
    (["--device", "gpu"], "--device", "gpu"),
    (["--dataset", "missing.jsonl"], "--dataset", "missing.jsonl"),
    (["--dataset", "arithmetic:zero"], "--dataset", "arithmetic:zero"),
    (["--config", "missing.yaml"], "--config", "missing.yaml"),
    (["--config", "bad.yaml"], "--config", "bad.yaml"),
    (["--config", "list.yaml"], "--config", "list.yaml"),
    (["--config", "unknown.yaml"], "warmup_steps", "unknown.yaml"),
    (["--save-steps", "-5"], "--save-steps", "-5"),
    (["--keep-checkpoints", "-1"], "--keep-checkpoints", "-1"),
    (["--is-cap", "abc"], "--is-cap", "abc"),
    (["--max-steps", "0"], "--max-steps", "0"),
    (["--max-steps", "2.5"], "--max-steps", "2.5"),
    (["--temperature", "1e-40"], "--temperature", "1e-40"),
    (["--top-p", "1.5"], "--top-p", "1.5"),
    (["--resume", "--overwrite"], "--overwrite", "--resume"),
    (["--progress", "--log-every", "-1"], "--log-every", "-1"),
    (["--preset", "huge"], "--preset", "huge"),
    (["--learning-rate", "1"], "--learning-rate", "--learning-rate"),
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    (d / "bad.yaml").write_text("lr: [1e-3\nmax_steps: 3\n")
    (d / "list.yaml").write_text("- lr\n- 1e-3\n")
    (d / "unknown.yaml").write_text("warmup_steps: 3\n")
    return d


@pytest.mark.parametrize("args,flag,value", BAD_FLAGS, ids=[" ".join(a) for a, _, _ in BAD_FLAGS])
def test_bad_flag_fails_fast_with_one_line(workdir, args, flag, value):
    out = workdir / ("out-" + "-".join(a.strip("-") for a in args))
    proc = fastrl("train", *FAST, "--output-dir", str(out), *args, cwd=workdir)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert flag in lines[0] and value in lines[0], lines[0]
    assert not out.exists()  # refused before anything was built or written
    assert proc.wall_s < 60, proc.wall_s  # import time only: nothing was built (seconds when the machine is idle)


def test_bad_config_file_value_names_the_key_and_file(workdir):
    (workdir / "eps.yaml").write_text("eps_low: 1.5\n")
    proc = fastrl("train", *FAST, "--config", "eps.yaml", "--output-dir", str(workdir / "o"), cwd=workdir)
    assert proc.returncode == 2 and "eps_low" in proc.stderr and "eps.yaml" in proc.stderr, proc.stderr


def test_hf_dataset_without_datasets_package_fails_before_the_model(workdir):
    # a `datasets` that cannot be imported, first on the path
    shim = workdir / "no_datasets"
    (shim / "datasets").mkdir(parents=True, exist_ok=True)
    (shim / "datasets" / "__init__.py").write_text("raise ImportError('datasets is not installed')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(shim), str(ROOT)])}
    proc = fastrl("train", "--preset", "math-32k", "--output-dir", str(workdir / "m"), cwd=workdir, env=env)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert "dataset='agentica-org/DeepScaleR-Preview-Dataset'" in proc.stderr and "pip install" in proc.stderr


def test_help_shows_every_default(workdir):
    proc = fastrl("train", "--help", cwd=workdir)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for snippet in ("--lr LR", "(default: 0.001)", "(default: token-mean)", "(default: runs/default)",
                    "(default: accuracy:1.0,format:0.1)", "(default: None)"):  # fmt: skip
        assert snippet in text, snippet


def _checkpoints(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step-"))


def test_reused_output_dir_is_refused_then_overwritten(tmp_path):
    out = tmp_path / "run"
    first = fastrl("train", *FAST, "--output-dir", str(out), "--max-steps", "3", "--save-steps", "1", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert metrics_steps(out) == [1, 2, 3] and _checkpoints(out) == ["step-00000002", "step-00000003"]
    before = (out / "metrics.jsonl").read_bytes()
    again = fastrl("train", *FAST, "--output-dir", str(out), "--max-steps", "2", cwd=tmp_path)
    assert again.returncode == 2, again.stderr[-3000:]
    line = again.stderr.strip()
    assert str(out) in line and "--resume" in line and "--overwrite" in line and "\n" not in line
    assert (out / "metrics.jsonl").read_bytes() == before and _checkpoints(out) == ["step-00000002", "step-00000003"]
    fresh = fastrl("train", *FAST, "--output-dir", str(out), "--max-steps", "2", "--overwrite", cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert metrics_steps(out) == [1, 2] and _checkpoints(out) == ["step-00000002"]
    # resuming a finished run reports its last step instead of an empty result
    done = fastrl("train", *FAST, "--output-dir", str(out), "--max-steps", "2", "--resume", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["step"] == 2
    assert "already" in done.stderr


def test_manifest_and_corrupt_checkpoint_falls_back(tmp_path):
    out = tmp_path / "run"
    args = ["train", *FAST, "--output-dir", str(out), "--save-steps", "1", "--keep-checkpoints", "3"]
    first = fastrl(*args, "--max-steps", "3", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    latest = out / "checkpoints" / "step-00000003"
    manifest = json.loads((latest / "manifest.json").read_text())
    assert set(manifest["files"]) == {"state.pt", "rng-rank0.pt"}
    for name, meta in manifest["files"].items():
        data = (latest / name).read_bytes()
        assert meta["bytes"] == len(data) and meta["sha256"] == hashlib.sha256(data).hexdigest()
    state = latest / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # a disk that filled up
    resumed = fastrl(*args, "--max-steps", "4", "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert str(state) in resumed.stderr and "step-00000002" in resumed.stderr, resumed.stderr[-3000:]
    assert metrics_steps(out) == [1, 2, 3, 4]  # step 3 redone from step 2's checkpoint, every step once
    assert _checkpoints(out)[-1] == "step-00000004"


def test_custom_reward_from_a_module(tmp_path):
    (tmp_path / "my_rewards.py").write_text(
        "def short(completion: str, gold: str) -> float:\n    return -len(completion) / 100\n"
    )
    out = tmp_path / "run"
    proc = fastrl("train", *FAST, "--output-dir", str(out), "--max-steps", "2", "--log-every", "1",
                  "--rewards", "accuracy:1.0,my_rewards:short:0.5", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["reward_short_mean"] <= 0 for r in rows)
    # --no-progress: one line per --log-every steps, as the run goes
    logged = [line for line in proc.stderr.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in logged] == ["1/2", "2/2"], proc.stderr[-2000:]


def test_custom_reward_through_the_python_api(tmp_path):
    from fastrl.trainer.config import make_config
    from fastrl.trainer.metrics import read_metrics
    from fastrl.trainer.trainer import train

    def short(completion: str, gold: str) -> float:
        return -len(completion) / 100

    cfg = make_config("tiny", output_dir=str(tmp_path), max_steps=2, warmup_sft_steps=0, prompts_per_step=2,
                      group_size=2, max_completion_length=4, progress=False, log_every=0)  # fmt: skip
    train(cfg, rewards=["accuracy:1.0", ("short", short, 0.5)])
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [1, 2]
    assert all(
        r["reward_short_mean"] <= 0 and "reward_accuracy_mean" in r and "reward_format_mean" not in r for r in rows
    )
    with pytest.raises(ValueError, match="rewards"):
        train(make_config("tiny", output_dir=str(tmp_path / "x")), rewards=[("short", "not callable", 1.0)])
