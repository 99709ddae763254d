"""The harness's honesty rules, tested on tiny CPU shapes: `pytest bench/test_harness.py` (~1 min).

Skipped under `--benchmark-only` (they time nothing); in the default testpaths (pyproject.toml), so CI runs them.
"""

import json
import os

import pytest
import torch

import bench.bench_grpo_loss as grpo_bench
import bench.bench_token_logprobs as tlp_bench
import fastrl.kernels.fused_loss.api as fused_api
import fastrl.kernels.logprobs.chunked as logprobs_chunked
from bench import __main__ as cli
from bench import report, verdict
from bench.harness import Result, Settings, ShapeCache, quantiles, rss_peak_bytes, run_config
from bench.providers import Provider, always, eager_token_logprobs
from bench.verdict import floor_rows, recompute_bound

CPU = torch.device("cpu")
TINY = dict(N=77, D=40, V=1001)
FAST = Settings(warmup=0, reps=2, budget_s=1.0, memory=False)


def run(provider: Provider, mode="fwd+bwd", settings=FAST) -> Result:
    return run_config(tlp_bench.OP, provider, TINY, "fp32", mode, CPU, settings, ShapeCache())


def test_quantiles_interpolate_linearly():
    assert quantiles([float(x) for x in range(1, 11)]) == pytest.approx((5.5, 2.8, 8.2))
    assert quantiles([3.0]) == (3.0, 3.0, 3.0)


@pytest.mark.parametrize("mode", ["fwd", "bwd", "fwd+bwd"])
def test_correct_provider_is_timed(mode):
    r = run(tlp_bench.OP.providers["fastrl-torch"], mode)
    assert r.status == "ok", r.note
    assert r.reps == 2 and 0 < r.p20_ms <= r.median_ms <= r.p80_ms
    assert max(r.errors.values()) < 1e-5


def test_wrong_answer_is_fail_with_no_figures():
    wrong = Provider("wrong", lambda h, w, t: eager_token_logprobs(h, w, t) + 1e-2, always)
    r = run(wrong)
    assert r.status == "FAIL" and "logp" in r.note
    assert r.median_ms is None and r.extra_mib is None and r.reps == 0


def test_wrong_gradient_alone_is_caught():
    class Detached(torch.autograd.Function):  # right values, gradient twice too large
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return 2 * g

    wrong = Provider("wrong-grad", lambda h, w, t: Detached.apply(eager_token_logprobs(h, w, t)), always)
    r = run(wrong)
    assert r.status == "FAIL" and "hidden.grad" in r.note and "logp" not in r.note
    assert r.median_ms is None


def test_raising_provider_is_error_and_unavailable_is_na():
    def boom(h, w, t):
        raise RuntimeError("kaput")

    r = run(Provider("boom", boom, always))
    assert r.status == "error" and "kaput" in r.note and r.median_ms is None
    r = run(Provider("absent", boom, lambda device: "not installed"))
    assert r.status == "n/a" and r.note == "not installed"


def test_rss_peak_sees_a_touched_allocation():
    peak = rss_peak_bytes(lambda: torch.ones(64 * 2**20 // 4))
    assert 60 * 2**20 <= peak < 200 * 2**20


@pytest.mark.slow
def test_cpu_memory_is_measured_in_a_subprocess():
    r = run(tlp_bench.OP.providers["eager"], settings=Settings(warmup=0, reps=2, budget_s=1.0, memory=True))
    assert r.status == "ref", r.note
    # the eager fwd+bwd holds at least the [N, V] float32 logits once
    assert r.extra_mib is not None and r.extra_mib * 2**20 >= TINY["N"] * TINY["V"] * 4


def test_fail_row_renders_without_numbers():
    rows = [
        Result("token_logprobs", "eager", "fwd", TINY, "fp32", "ref", median_ms=2.0, p20_ms=1.0, p80_ms=3.0),
        Result("token_logprobs", "bad", "fwd", TINY, "fp32", "FAIL", "logp rel err 1e-02 > 1e-04"),
    ]
    table = report.sweep_table(rows, "eager", gpu=False)
    bad = next(line for line in table.splitlines() if "| bad |" in line)
    assert "FAIL" in bad and "ms" not in bad and bad.count("—") >= 5


@pytest.mark.slow
def test_cli_quick_writes_json_markdown_and_plots(tmp_path, monkeypatch):
    monkeypatch.setattr(tlp_bench, "CPU_QUICK", [dict(N=n, D=40, V=1001) for n in (64, 128)])
    monkeypatch.setattr(grpo_bench, "CPU_QUICK", [dict(B=2, T=t, D=40, V=1001) for t in (32, 64)])
    out = tmp_path / "out"
    assert cli.main(["--device", "cpu", "--quick", "--out", str(out), "--providers", "eager,fastrl-torch"]) == 0
    data = json.loads((out / "cpu_quick.json").read_text())
    assert {"device", "torch", "triton", "git_sha", "timestamp_utc"} <= set(data["environment"])
    measured = [r for r in data["results"] if r["status"] in ("ok", "ref")]
    assert {r["op"] for r in measured} == {"token_logprobs", "grpo_loss"}
    assert all(r["median_ms"] > 0 for r in measured)
    text = (out / "cpu_quick.md").read_text()
    assert "peak extra memory" in text and "fastrl-torch" in text
    pngs = [f for f in os.listdir(out) if f.endswith(".png")]
    assert any(f.startswith("token_logprobs_fwd_bwd") for f in pngs) and any(f.startswith("grpo_loss") for f in pngs)


def _row(op, provider, ms, mib, status="ok", shape=TINY):
    return Result(op, provider, "fwd+bwd", shape, "fp32", status, median_ms=ms, p20_ms=ms, p80_ms=ms, extra_mib=mib)


def _passing_results(fastrl_ms: float, fastrl_loss_ms: float) -> list[Result]:
    g = dict(B=2, T=8, D=4, V=16)
    return [
        _row("token_logprobs", "eager", 100.0, 1000.0, "ref"),
        _row("token_logprobs", "cce", 95.0, 200.0),  # lean: ≤ 1/4 of eager's memory
        _row("token_logprobs", "trl", 80.0, 900.0),  # faster but not lean: no target against it
        _row("token_logprobs", "compile", 150.0, 1000.0),
        _row("token_logprobs", "torch-lce", 150.0, 900.0),
        _row("token_logprobs", "fastrl-torch", fastrl_ms, 50.0),
        _row("token_logprobs", "blas-floor", 60.0, None, "floor"),
        _row("token_logprobs", "recompute-floor", 80.0, None, "floor"),
        _row("grpo_loss", "eager", 100.0, 1000.0, "ref", g),
        _row("grpo_loss", "cce", 90.0, 500.0, "ok", g),
        *(_row("grpo_loss", p, 150.0, 500.0, "ok", g) for p in ("compile", "trl", "torch-lce")),
        _row("grpo_loss", "fastrl-torch", fastrl_loss_ms, 20.0, "ok", g),
        _row("grpo_loss", "blas-floor", 70.0, None, "floor", g),
    ]


def test_verdict_counts_failures_and_a_planted_slowdown_fails_it():
    from bench.verdict import floor_rows, target_rows, verdict_line

    ok = _passing_results(fastrl_ms=82.0, fastrl_loss_ms=75.0)
    rows, errors = target_rows(ok), floor_rows(ok)
    assert all(r["verdict"].startswith("PASS") for r in rows) and not errors, rows
    assert verdict_line(rows, errors).startswith("**verdict: PASS**")
    slow = _passing_results(fastrl_ms=82.0 * 1.15, fastrl_loss_ms=75.0 * 1.15)  # 15% slower fold
    rows = target_rows(slow)
    line = verdict_line(rows, floor_rows(slow))
    assert line.startswith("**verdict: FAIL**") and sum(r["verdict"] == "FAIL" for r in rows) >= 3, line


def _verdict(results):
    from bench.verdict import floor_rows, target_rows, verdict_line

    rows = target_rows(results)
    return rows, verdict_line(rows, floor_rows(results))


def test_a_missing_lean_peer_is_reported_and_is_no_pass():
    res = [r for r in _passing_results(82.0, 75.0) if (r.op, r.provider) != ("token_logprobs", "cce")]
    res.append(Result("token_logprobs", "cce", "fwd+bwd", TINY, "fp32", "n/a", "cut_cross_entropy is not installed"))
    rows, line = _verdict(res)
    missing = [(r["op"], r["vs"], r["verdict"]) for r in rows if r["verdict"].startswith("MISSING")]
    assert missing == [("token_logprobs", "cce", "MISSING (n/a: cut_cross_entropy is not installed)")], rows
    assert not any("no such peer" in r["verdict"] for r in rows)
    assert line.startswith("**verdict: INCOMPLETE**") and "1 peer missing (cce)" in line, line
    # every peer of the op gone (not run at all): the lean-peers target itself is not measured, and fails
    res = [r for r in res if r.op == "grpo_loss" or r.provider in ("fastrl-torch", "blas-floor", "recompute-floor")]
    rows, line = _verdict(res)
    lean = [
        r for r in rows if r["op"] == "token_logprobs" and r.get("kind", "target") == "target" and "peer" in r["vs"]
    ]
    assert [r["verdict"] for r in lean] == ["not measured (fastrl-torch ok, MISSING: no live-row peer measured "
                                            "missing)"], lean  # fmt: skip
    gone = {r["vs"] for r in rows if r["op"] == "token_logprobs" and r["verdict"] == "MISSING (not run)"}
    assert gone == {"eager", "compile", "cce", "torch-lce", "trl"}, gone
    assert line.startswith("**verdict: FAIL**"), line


def test_an_errored_peer_is_listed_with_its_reason():
    g = dict(B=2, T=8, D=4, V=16)
    res = [r for r in _passing_results(82.0, 75.0) if (r.op, r.provider) != ("grpo_loss", "trl")]
    res.append(Result("grpo_loss", "trl", "fwd+bwd", g, "fp32", "error", "RuntimeError: kaput"))
    rows, line = _verdict(res)
    assert ("grpo_loss", "trl", "MISSING (error: RuntimeError: kaput)") in {
        (r["op"], r["vs"], r["verdict"]) for r in rows
    }, rows
    assert line.startswith("**verdict: INCOMPLETE**"), line


def test_an_all_rows_peer_is_labelled_and_kept_out_of_live_row_targets():
    g = dict(B=2, T=8, D=4, V=16)
    # faster than every live-row peer and lean: they would fail fastrl's targets if they were compared
    res = _passing_results(82.0, 75.0) + [_row("grpo_loss", "liger", 80.0, 100.0, "ok", g),
                                          _row("grpo_loss", "trl-all-rows", 85.0, 100.0, "ok", g),
                                          _row("token_logprobs", "trl-all-rows", 81.0, 10.0)]  # fmt: skip
    rows, line = _verdict(res)
    targets = {(r["op"], r["vs"], r["verdict"]) for r in rows if r.get("kind", "target") == "target"}
    assert ("grpo_loss", "fastest peer (cce)", "PASS") in targets, targets
    assert not any("liger" in vs or "all-rows" in vs for _, vs, _ in targets), targets
    labelled = {(r["op"], r["vs"]) for r in rows if r.get("kind") == "info"}
    more = "(all rows: more work)"
    assert labelled == {("grpo_loss", f"liger {more}"), ("grpo_loss", f"trl-all-rows {more}"),
                        ("token_logprobs", f"trl-all-rows {more}")}, labelled  # fmt: skip
    assert line.startswith("**verdict: PASS**"), line


def test_a_candidate_beating_a_floor_is_an_error():
    from bench.verdict import floor_rows, verdict_line

    res = _passing_results(fastrl_ms=55.0, fastrl_loss_ms=65.0)
    errors = floor_rows(res)
    beaten = {(e["op"], e["candidate"], e["vs"]) for e in errors}
    assert beaten == {
        ("token_logprobs", "fastrl-torch", "blas-floor"),
        ("token_logprobs", "fastrl-torch", "recompute-floor"),
        ("grpo_loss", "fastrl-torch", "blas-floor"),
    }, beaten
    assert ("token_logprobs", "trl", "recompute-floor") not in beaten  # 80 ms is not below 80 ms
    assert "3 floor errors" in verdict_line([], errors) and "FAIL" in verdict_line([], errors)


def test_floors_time_the_gemms_over_their_rows():
    from bench import floors

    h, w = torch.randn(37, 8, requires_grad=True), torch.randn(50, 8, requires_grad=True)
    z = h.detach() @ w.detach().T  # the floor's "gradient" is z·W and zᵀ·h: the GEMMs, checked for shape
    for layout in floors.LAYOUTS:
        for size in (5, 16, 37):  # a short last tile or slab, and the whole batch
            dh, dw = torch.zeros(37, 8), torch.zeros(50, 8)
            floors._gemms(h.detach(), w.detach(), layout, size, (dh, dw))
            torch.testing.assert_close(dh, z @ w.detach())
            torch.testing.assert_close(dw, z.T @ h.detach())
    for floor in (floors.blas_floor, floors.recompute_floor):
        dh, dw = torch.autograd.grad(floor(h, w), (h, w), torch.ones(37))
        torch.testing.assert_close(dh, z @ w.detach())
        torch.testing.assert_close(dw, z.T @ h.detach())


def test_floor_calibration_records_a_tiling_per_part(monkeypatch):
    from bench import floors

    monkeypatch.setattr(floors, "CHOSEN", {})
    monkeypatch.setattr(floors, "TILE_ROWS", (8, 16))
    monkeypatch.setattr(floors, "VOCAB_COLS", (16, 64))
    want = [(lay, r) for lay in ("z", "zT") for r in (8, 16, 37)] + [("v", 16), ("v", 50)]
    assert floors.candidates(37, 50) == want
    h, w = torch.randn(37, 8), torch.randn(50, 8)
    floors.blas_floor(h, w)
    assert set(floors.CHOSEN) == {(37, 8, 50, "3 GEMMs")}
    floors.recompute_floor(h, w)
    assert set(floors.CHOSEN) == {(37, 8, 50, "3 GEMMs"), (37, 8, 50, "logits")}
    assert all(c in want for c in floors.CHOSEN.values())
    layout, size = floors.CHOSEN[37, 8, 50, "logits"]
    assert f"N_live=37 D=8 V=50 logits: {layout}, {size}" in floors.tilings_line()


@pytest.mark.slow
def test_cli_acceptance_prints_a_verdict(tmp_path, monkeypatch):
    monkeypatch.setattr(tlp_bench, "ACCEPTANCE", dict(N=96, D=16, V=300))
    monkeypatch.setattr(grpo_bench, "ACCEPTANCE", dict(B=2, T=24, D=16, V=300))
    out = tmp_path / "out"
    argv = ["--device", "cpu", "--acceptance", "--reps", "2", "--no-memory", "--out", str(out),
            "--providers", "eager,fastrl-torch,torch-lce,blas-floor,recompute-floor"]  # fmt: skip
    assert cli.main(argv) == 0
    text = (out / "cpu_acceptance.md").read_text()
    assert "**verdict: FAIL**" in text  # memory was not measured: those targets cannot pass
    data = json.loads((out / "cpu_acceptance.json").read_text())
    lce = [r for r in data["results"] if r["provider"] == "torch-lce"]
    assert len(lce) == 2 and all(r["status"] == "ok" for r in lce), lce


# which floor binds which candidate, on synthetic rows at the token_logprobs acceptance shape
BIG = dict(N=8192, D=512, V=32768)
LIVE = 7772
LOGITS_MIB = LIVE * BIG["V"] * 4 / 2**20  # ≈ 971.5 MiB: the float32 logits of the live rows


def _scored(provider, ms, mib=None, status="ok", live=LIVE):  # a row at the acceptance shape
    return Result("token_logprobs", provider, "fwd+bwd", BIG, "fp32", status, median_ms=ms, p20_ms=ms,
                  p80_ms=ms, extra_mib=mib, live_rows=live)  # fmt: skip


def _big_floors():
    return [_scored("blas-floor", 60.0, status="floor"), _scored("recompute-floor", 80.0, status="floor")]


def _floor_errors(rows):
    return {(e["candidate"], e["vs"]) for e in floor_rows(rows)}


def test_a_memory_heavy_candidate_is_not_bound_by_the_recompute_floor():
    heavy = _scored("cce", 70.0, mib=LOGITS_MIB)  # keeps the logits: the recompute floor does not bound it
    assert recompute_bound(heavy)[0] is False
    assert _floor_errors(_big_floors() + [heavy]) == set()
    just_under = _scored("cce", 70.0, mib=LOGITS_MIB / 2 - 1)  # too little memory to keep them
    assert _floor_errors(_big_floors() + [just_under]) == {("cce", "recompute-floor")}


def test_a_lean_candidate_beating_the_recompute_floor_is_an_error_whatever_its_flag():
    lean = [_scored("fastrl-torch", 70.0, mib=50.0), _scored("eager", 75.0, mib=100.0, status="ref")]
    errors = floor_rows(_big_floors() + lean)
    assert {(e["candidate"], e["vs"]) for e in errors} == {(p, "recompute-floor") for p in ("fastrl-torch", "eager")}
    assert all("MiB < ½ of the 972 MiB live logits" in e["verdict"] for e in errors), errors


def test_unmeasured_memory_falls_back_to_the_recomputes_flag():
    # CCE's CPU path keeps the logits: not flagged as recomputing
    unmeasured = [_scored("trl", 70.0), _scored("eager", 70.0, status="ref"),
                  _scored("torch-lce", 70.0, 500.0, live=None), _scored("cce", 70.0)]  # fmt: skip
    rows = _big_floors() + unmeasured
    assert _floor_errors(rows) == {("trl", "recompute-floor"), ("torch-lce", "recompute-floor")}
    assert "memory not measured" in recompute_bound(_scored("trl", 70.0))[1]


def test_the_blas_floor_binds_every_candidate():
    fast = [_scored("cce", 55.0, mib=2 * LOGITS_MIB), _scored("fastrl-torch", 59.0, mib=50.0), _scored("trl", 61.0)]
    expected = {("cce", "blas-floor"), ("fastrl-torch", "blas-floor"), ("fastrl-torch", "recompute-floor"),
                ("trl", "recompute-floor")}  # fmt: skip
    assert _floor_errors(_big_floors() + fast) == expected


@pytest.mark.slow
def test_a_planted_slowdown_fires_and_the_run_says_it_is_planted(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tlp_bench, "ACCEPTANCE", dict(N=96, D=16, V=300))
    monkeypatch.setattr(grpo_bench, "ACCEPTANCE", dict(B=2, T=24, D=16, V=300))
    out = tmp_path / "out"
    argv = ["--device", "cpu", "--acceptance", "--reps", "2", "--no-memory", "--out", str(out),
            "--providers", "eager,fastrl-torch", "--plant-slowdown", "0.15"]  # fmt: skip
    originals = (fused_api.fused_forward, logprobs_chunked.chunked_forward, logprobs_chunked.chunked_backward)
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
    assert (fused_api.fused_forward, logprobs_chunked.chunked_forward, logprobs_chunked.chunked_backward) == originals
    assert not hasattr(fused_api.fused_forward, "__wrapped__")
    capsys.readouterr()
    verdict.main([str(out / "cpu_acceptance_planted.json")])
    assert "PLANTED SLOW-DOWN" in capsys.readouterr().out


def test_a_target_below_the_candidates_own_floor_is_marked_unreachable():
    # eager 100 ms, recompute floor 95 ms: ≤ 0.90× eager is below the floor a recomputing candidate is bound by
    rows = [_scored("eager", 100.0, mib=2000.0, status="ref"), _scored("fastrl-torch", 96.0, mib=50.0),
            _scored("blas-floor", 70.0, status="floor"), _scored("recompute-floor", 95.0, status="floor")]  # fmt: skip
    got = {(r["vs"], r["verdict"]) for r in verdict.target_rows(rows) if r["quantity"] == "time"}
    assert ("eager", "FAIL (unreachable here: recompute-floor itself is 0.950× eager)") in got, got
    rows[3] = _scored("recompute-floor", 85.0, status="floor")  # now 0.85× eager: reachable, a plain FAIL
    got = {(r["vs"], r["verdict"]) for r in verdict.target_rows(rows) if r["quantity"] == "time"}
    assert ("eager", "FAIL") in got, got


LONG_CALL = ["--N", "4096", "--D", "8", "--V", "64"]


def test_long_call_runs_both_ops_and_checks_them(capsys):
    from bench import long_call

    assert long_call.main(LONG_CALL) == 0
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| token") or
            line.startswith("| grpo")]  # fmt: skip
    assert [r[1].strip() for r in rows] == ["token_logprobs", "grpo_loss"]
    assert all(float(r[4]) < 1e-5 for r in rows), rows  # worst relative error against the eager reference


def test_long_call_fails_a_wrong_grpo_loss_gradient_and_drops_its_figures(capsys, monkeypatch):
    import fastrl
    from bench import long_call

    class Doubled(torch.autograd.Function):  # the hidden states as they are, their gradient twice too large
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return 2 * g

    right = fastrl.grpo_loss
    monkeypatch.setattr(fastrl, "grpo_loss", lambda h, *args, **kw: right(Doubled.apply(h), *args, **kw))
    assert long_call.main(LONG_CALL) == 1
    captured = capsys.readouterr()
    row = next(line for line in captured.out.splitlines() if line.startswith("| grpo_loss"))
    assert row.split("|")[2].strip() == "FAIL" and "| — |" in row, row  # the loss value is right: the gradient fails
    assert "FAILED: grpo_loss" in captured.err


@pytest.mark.slow
def test_the_readme_sweep_checks_times_and_measures_each_provider_in_one_call():
    # one fresh process per provider and point: its first call is checked here, timed and measured for memory
    from bench import readme_sweep

    limits, per_token = (8 * 2**30, 600.0, {"fastrl-torch": 1024}), {}
    for op_name in readme_sweep.OPS:
        rows, reference = readme_sweep.sweep_point(
            op_name, ["eager", "fastrl-torch"], 1024, 16, 256, limits, per_token, 2
        )
        assert reference == "eager"
        by = {r.provider: r for r in rows}
        assert by["eager"].status in ("ref", "ok") and by["fastrl-torch"].status == "ok", [
            (r.status, r.note) for r in rows
        ]
        for r in rows:
            assert r.reps == 2 and r.median_ms > 0 and r.extra_mib is not None and r.live_rows > 0
            assert r.errors and max(r.errors.values()) <= 1e-4
        assert set(per_token) >= {(op_name, "eager"), (op_name, "fastrl-torch")}
    # past its --max-tokens entry a provider is a skipped row saying why, never a measured one
    (row,), _ = readme_sweep.sweep_point("token_logprobs", ["fastrl-torch"], 2048, 16, 256, limits, per_token, 1)
    assert row.status == "skipped" and "--max-tokens" in row.note and row.median_ms is None
    # a reference the provider does not match is a FAIL row naming the output
    op = readme_sweep.OPS["grpo_loss"]
    shape = readme_sweep.shape_at("grpo_loss", 1024, 16, 256)
    ref = op.reference(op.make_inputs(shape, torch.float32, CPU, readme_sweep.SEED))
    ref["weight.grad"] = ref["weight.grad"] * 1.01
    row, _ = readme_sweep.one_call(op, "fastrl-torch", shape, 1, ref)
    assert row.status == "FAIL" and "weight.grad" in row.note and row.reps == 1
