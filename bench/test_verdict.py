"""Which floor binds which candidate, and the planted slow-down, on synthetic rows and tiny shapes (~10 s)."""

import json

import bench.bench_grpo_loss as grpo_bench
import bench.bench_token_logprobs as tlp_bench
import fastrl.kernels.fused_loss.api as fused_api
import fastrl.kernels.logprobs.chunked as logprobs_chunked
import fastrl.kernels.logprobs.function as logprobs_function
from bench import __main__ as cli
from bench import verdict
from bench.harness import Result
from bench.verdict import floor_rows, recompute_bound

SHAPE = dict(N=8192, D=512, V=32768)
LIVE = 7772
LOGITS_MIB = LIVE * SHAPE["V"] * 4 / 2**20  # ≈ 971.5 MiB: the float32 logits of the live rows


def _row(provider, ms, mib=None, status="ok", live=LIVE):
    return Result("token_logprobs", provider, "fwd+bwd", SHAPE, "fp32", status, median_ms=ms, p20_ms=ms,
                  p80_ms=ms, extra_mib=mib, live_rows=live)  # fmt: skip


def _floors():
    return [_row("blas-floor", 60.0, status="floor"), _row("recompute-floor", 80.0, status="floor")]


def _errors(rows):
    return {(e["candidate"], e["vs"]) for e in floor_rows(rows)}


def test_a_memory_heavy_candidate_is_not_bound_by_the_recompute_floor():
    heavy = _row("cce", 70.0, mib=LOGITS_MIB)  # keeps the logits: the recompute floor does not bound it
    assert recompute_bound(heavy)[0] is False
    assert _errors(_floors() + [heavy]) == set()
    just_under = _row("cce", 70.0, mib=LOGITS_MIB / 2 - 1)  # too little memory to keep them
    assert _errors(_floors() + [just_under]) == {("cce", "recompute-floor")}


def test_a_lean_candidate_beating_the_recompute_floor_is_an_error_whatever_its_flag():
    lean = [_row("fastrl-torch", 70.0, mib=50.0), _row("eager", 75.0, mib=100.0, status="ref")]
    errors = floor_rows(_floors() + lean)
    assert {(e["candidate"], e["vs"]) for e in errors} == {("fastrl-torch", "recompute-floor"),
                                                           ("eager", "recompute-floor")}  # fmt: skip
    assert all("MiB < ½ of the 972 MiB live logits" in e["verdict"] for e in errors), errors


def test_unmeasured_memory_falls_back_to_the_recomputes_flag():
    rows = _floors() + [_row("trl", 70.0), _row("eager", 70.0, status="ref"), _row("cce", 70.0, mib=500.0, live=None)]
    assert _errors(rows) == {("trl", "recompute-floor"), ("cce", "recompute-floor")}
    assert "memory not measured" in recompute_bound(_row("trl", 70.0))[1]


def test_the_blas_floor_binds_every_candidate():
    rows = _floors() + [_row("cce", 55.0, mib=2 * LOGITS_MIB), _row("fastrl-torch", 59.0, mib=50.0), _row("trl", 61.0)]
    assert _errors(rows) == {("cce", "blas-floor"), ("fastrl-torch", "blas-floor"),
                             ("fastrl-torch", "recompute-floor"), ("trl", "recompute-floor")}  # fmt: skip


def test_a_planted_slowdown_fires_and_the_run_says_it_is_planted(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tlp_bench, "ACCEPTANCE", dict(N=96, D=16, V=300))
    monkeypatch.setattr(grpo_bench, "ACCEPTANCE", dict(B=2, T=24, D=16, V=300))
    out = tmp_path / "out"
    argv = ["--device", "cpu", "--acceptance", "--reps", "2", "--no-memory", "--out", str(out),
            "--providers", "eager,fastrl-torch", "--plant-slowdown", "0.15"]  # fmt: skip
    originals = (fused_api.fused_forward, logprobs_function.chunked_forward, logprobs_chunked.chunked_backward)
    assert cli.main(argv) == 0
    data = json.loads((out / "cpu_acceptance_planted.json").read_text())
    planted = data["environment"]["planted_slowdown"]
    assert planted["fraction"] == 0.15 and planted["delay_s"] > 0
    assert all(n > 0 for n in planted["calls"].values()), planted  # each of the three walks was slowed
    assert set(planted["calls"]) == {"fused_forward", "chunked_forward", "chunked_backward"}
    text = (out / "cpu_acceptance_planted.md").read_text()
    assert text.startswith("- **PLANTED SLOW-DOWN — NOT A REAL RUN**") and "0.15" in text.splitlines()[0]
    assert not (out / "cpu_acceptance.json").exists()  # a planted run never takes a real run's file name
    # the kernels are themselves again afterwards
    assert (fused_api.fused_forward, logprobs_function.chunked_forward, logprobs_chunked.chunked_backward) == originals
    assert not hasattr(fused_api.fused_forward, "__wrapped__")
    capsys.readouterr()
    verdict.main([str(out / "cpu_acceptance_planted.json")])
    assert "PLANTED SLOW-DOWN" in capsys.readouterr().out
