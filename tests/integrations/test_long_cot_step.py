"""bench/long_cot_step.py end to end at a tiny shape: every provider runs in its own process, its gradients
agree with stock TRL's, and the table comes last. Guards the script against drift in TRL or the trainer."""

import sys

from bench import long_cot_step

TINY = ["--completion-length", "40", "--prompt-length", "8", "--group", "2", "--layers", "1", "--vocab", "512",
        "--hidden", "32", "--intermediate", "64", "--heads", "4", "--kv-heads", "2", "--budget", "64", "--steps", "2",
        "--warmup-length", "24", "--timeout-s", "300"]  # fmt: skip


def test_every_provider_runs_and_matches_trl(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["long_cot_step"])
    rows = long_cot_step.main(TINY)
    out = capsys.readouterr().out
    assert [r["provider"] for r in rows] == list(long_cot_step.PROVIDERS)
    for r in rows:
        assert r["status"] == "ok", r
        assert r["grad_rel"] <= long_cot_step.REL_TOL and r["seconds"] > 0 and r["peak_mib"] > 0
    # budget 64 < 2 x 48 tokens: the trainer's update ran two micro-batches, TRL one batch
    assert out.rstrip().splitlines()[-1].startswith("| eager (full logits) | ok |")
    assert all(len(r["times_s"]) == 2 for r in rows)


def test_warmup_length_is_checked():
    import pytest

    with pytest.raises(SystemExit):
        long_cot_step.parse(TINY + ["--warmup-length", "41"])
