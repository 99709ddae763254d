"""bench/long_cot_step.py: each provider is checked against the reference (stock TRL, else eager) before its
figures are printed or written, on the gradients and per-token log-probs (which depend on the model, unlike the
on-policy loss), and a run without TRL says so. The checks run on fake provider outputs (no subprocess); one
test runs the real eager step in-process at a tiny shape; the end-to-end run of every provider is `slow`."""

import json
import sys

import pytest
import torch

from bench import long_cot_providers, long_cot_step

TINY = ["--completion-length", "40", "--prompt-length", "8", "--group", "2", "--layers", "1", "--vocab", "512",
        "--hidden", "32", "--intermediate", "64", "--heads", "4", "--kv-heads", "2", "--budget", "64", "--steps", "2",
        "--warmup-length", "24", "--timeout-s", "300"]  # fmt: skip
FIGURES = dict(loss=-0.25, warmup_s=0.1, times_s=[1.0, 1.0], seconds=1.0, peak_mib=10.0, rise_mib=1.0)


def _fake_run(outputs: dict, ran: list):
    """run_provider that writes `outputs[name]` = (gradients, log-probs) where the child would, and its row."""

    def run(name, opts, grads_out):
        ran.append(name)
        grads, logp = outputs[name]
        torch.save(grads, grads_out)
        torch.save(logp, long_cot_step.logp_path(grads_out))
        return dict(provider=name, status="ok", **FIGURES)

    return run


def _outputs():
    g = torch.Generator().manual_seed(0)
    grads, logp = {"w": torch.randn(8, 4, generator=g)}, -5 * torch.rand(2, 24, generator=g)
    return {
        "trl": (grads, logp),
        "fastrl-trl": (grads, logp + 1e-6),
        "fastrl": (grads, logp + 1e-2),  # the same gradients (and loss), other log-probs: a different model
        "eager": ({"w": grads["w"] * 1.01}, logp),  # the same log-probs, other gradients
    }


@pytest.fixture
def fake(monkeypatch):
    ran: list = []
    monkeypatch.setattr(long_cot_step, "save_model", lambda opts, path: None)
    monkeypatch.setattr(long_cot_step, "run_provider", _fake_run(_outputs(), ran))
    monkeypatch.setattr(sys, "argv", ["long_cot_step"])
    return ran


def test_a_provider_failing_its_check_is_never_printed_or_written_with_figures(fake, capsys, tmp_path):
    rows = long_cot_step.main(TINY + ["--providers", "fastrl,trl,fastrl-trl,eager", "--out", str(tmp_path / "o.json")])
    assert fake == ["trl", "fastrl", "fastrl-trl", "eager"]  # the reference first
    status = {r["provider"]: r["status"] for r in rows}
    assert status["trl"] == status["fastrl-trl"] == "ok", status
    assert status["fastrl"].startswith("FAIL against trl") and "log-prob max |Δ| 1.0e-02" in status["fastrl"]
    assert status["eager"].startswith("FAIL against trl") and "gradient rel L2 1.0e-02" in status["eager"]
    assert long_cot_step.failed(rows) == ["fastrl", "eager"]
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    written = json.loads((tmp_path / "o.json").read_text())["rows"]
    for rows_seen in (printed, written):
        seen = {r["provider"]: r for r in rows_seen}
        assert "seconds" in seen["fastrl-trl"] and "seconds" in seen["trl"]
        assert not {"seconds", "peak_mib", "loss"} & (set(seen["fastrl"]) | set(seen["eager"])), seen


def test_without_trl_the_run_says_what_was_not_checked(fake, capsys, monkeypatch):
    monkeypatch.setattr(long_cot_step, "trl_installed", lambda: False)
    rows = long_cot_step.main(TINY)
    err = capsys.readouterr().err
    want = "TRL IS NOT INSTALLED: not run: trl, fastrl-trl; not checked against stock TRL: fastrl; checked against"
    assert want + " eager instead" in err, err
    assert fake == ["eager", "fastrl"]  # nothing that needs TRL was started
    assert {r["provider"]: r["status"] for r in rows}["fastrl"].startswith("FAIL against eager")
    assert long_cot_step.failed(rows) == ["trl", "fastrl", "fastrl-trl"]
    # no reference at all: fastrl's figures are not shown, and the run says nothing was checked
    rows = long_cot_step.main(TINY + ["--providers", "fastrl"])
    assert "NOTHING CHECKED" in capsys.readouterr().err
    assert rows[0]["status"].startswith("UNCHECKED") and "seconds" not in rows[0]


def test_the_log_probs_see_a_different_model_where_the_on_policy_loss_does_not(tmp_path, monkeypatch):
    opts = long_cot_step.parse(TINY)
    opts.model_dir = str(tmp_path / "model")
    long_cot_step.save_model(opts, opts.model_dir)
    load, paths, rows, losses = long_cot_providers._load, {}, {}, {}

    def perturbed(opts):
        model = load(opts)
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(1.05)  # tied: the head changes too
        return model

    for name in ("saved", "perturbed"):
        if name == "perturbed":
            monkeypatch.setattr(long_cot_providers, "_load", perturbed)
        _, _, step, score = long_cot_providers.eager_step(opts)  # the eager provider's own code
        paths[name] = str(tmp_path / f"{name}.pt")
        torch.save({"w": torch.ones(3)}, paths[name])  # equal gradients: the log-probs alone must tell them apart
        torch.save(score(24), long_cot_step.logp_path(paths[name]))
        losses[name] = step(24)
        rows[name] = dict(provider=name, status="ok", **FIGURES)
    assert losses["saved"] == pytest.approx(losses["perturbed"], abs=1e-6)  # −mean(adv) for any model
    long_cot_step.check(rows["perturbed"], rows["saved"], paths)
    assert rows["perturbed"]["status"].startswith("FAIL against saved"), rows["perturbed"]
    assert rows["perturbed"]["logp_diff"] > 1e-3 and "seconds" not in rows["perturbed"]


@pytest.mark.slow
def test_every_provider_runs_and_matches_trl(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["long_cot_step"])
    rows = long_cot_step.main(TINY)
    out = capsys.readouterr().out
    assert [r["provider"] for r in rows] == list(long_cot_step.PROVIDERS)
    assert not long_cot_step.failed(rows)
    for r in rows:
        assert r["status"] == "ok", r
        assert r["seconds"] > 0 and r["peak_mib"] > 0
        if r["provider"] != "trl":
            assert r["checked"] == "trl" and r["grad_rel"] <= long_cot_step.REL_TOL, r
            assert r["logp_diff"] <= long_cot_step.LOGP_TOL, r
    # budget 64 < 2 x 48 tokens: the trainer's update ran two micro-batches, TRL one batch
    assert out.rstrip().splitlines()[-1].startswith("| eager (full logits) | ok |")
    assert all(len(r["times_s"]) == 2 for r in rows)


def test_warmup_length_is_checked():
    with pytest.raises(SystemExit):
        long_cot_step.parse(TINY + ["--warmup-length", "41"])
