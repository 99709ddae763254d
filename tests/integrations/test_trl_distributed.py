"""`FastRLGRPOTrainer` against TRL's real `GRPOTrainer` on 2 CPU processes (accelerate's MULTI_CPU, gloo).

One launch of `trl_dist_worker.py` under `torch.distributed.run` (a module fixture) runs every case of every
engine in turn, and each case is then checked by its own test. Both trainers train 3 optimizer
steps (gradient accumulation 2) from one seed, each rank on its own prompts, so the ranks score different numbers
of completion tokens. After training, each trainer's parameters are identical on both ranks, fastrl's equal stock's
(fp32, within 1e-5 of the update), every logged metric equals stock's, and so does every log-prob tensor the
trainer computed (the old / reference passes and the training forwards).
"""

import contextlib
import json
import math
import os
import pathlib
import subprocess
import sys

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "trl_dist_worker.py"
FP32_TOL = 1e-5
V = 64  # the harness model's vocabulary
TIMEOUT_S = 900


TRAINERS = ("stock", "fastrl")


def launch(out, rows: list):
    """Run the worker on 2 ranks over `rows` (dicts with a "name"); return `out`, where each row's results lie."""
    spec = {"rows": rows, "trainers": TRAINERS, "out": str(out)}
    spec_path = out / "spec.json"
    spec_path.write_text(json.dumps(spec))
    root = str(HERE.parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(WORKER)]
    proc = subprocess.run([*cmd, str(spec_path)], cwd=out, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    started = [line for line in proc.stdout.splitlines() if line.startswith("row ")]  # the row that failed is last
    assert proc.returncode == 0, f"{started[-1:]}: {proc.stdout[-2000:]}{proc.stderr[-6000:]}"
    return out


def row_results(out, name: str) -> dict:
    """{trainer: [rank 0 result, rank 1 result]} of one row of a launch."""
    return {kind: [torch.load(out / name / f"{kind}-rank{r}.pt") for r in (0, 1)] for kind in TRAINERS}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


def compare(results, base_params) -> dict:
    """Assert the equalities of the module docstring; return the max relative differences, for the record."""
    for kind, ranks in results.items():
        for name, p in ranks[0]["params"].items():
            assert torch.equal(p, ranks[1]["params"][name]), (kind, name, "ranks differ")
    stock, ours = results["stock"], results["fastrl"]
    assert stock[0]["tokens"] != stock[1]["tokens"], "the ranks scored equal token counts: the case is too easy"
    logs_a, logs_b = stock[0]["logs"], ours[0]["logs"]
    assert len(logs_a) == len(logs_b) == 4
    for step, (a, b) in enumerate(zip(logs_a, logs_b)):
        assert a.keys() == b.keys(), (step, a.keys() ^ b.keys())
        for key, value in a.items():
            if isinstance(value, float):
                assert math.isclose(value, b[key], rel_tol=FP32_TOL, abs_tol=1e-7), (step, key, value, b[key])
            else:
                assert value == b[key], (step, key, value, b[key])
    out = {"loss": max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(logs_a[:-1], logs_b[:-1]))}
    logp = 0.0
    for rank in (0, 1):
        a, b = stock[rank], ours[rank]
        assert a["tokens"] == b["tokens"] and len(a["logps"]) == len(b["logps"])
        for x, y in zip(a["logps"], b["logps"]):
            torch.testing.assert_close(y, x, rtol=FP32_TOL, atol=FP32_TOL)
            logp = max(logp, rel(y, x))
    params_a, params_b = stock[0]["params"], ours[0]["params"]
    update = max((params_a[n] - base_params[n]).abs().max().item() for n in params_a)
    assert update > 1e-3, "the run did not train"
    diff = max((params_a[n] - params_b[n]).abs().max().item() for n in params_a)
    assert diff <= FP32_TOL * update, (diff, update)
    out.update(logp=logp, params=diff / update, gathers=[r["gathers_per_call"] for r in ours])
    print(out)
    return out


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    import trl_harness as h

    path = tmp_path_factory.mktemp("model")
    h.model().save_pretrained(path)
    return str(path)


def _base(spec):
    import trl_harness as h

    return {n: p.detach() for n, p in h.model(tie=spec.get("tie", False)).named_parameters()}


DDP_CASES = {
    "dapo-kl-off-policy": dict(loss_type="dapo", beta=0.1, steps_per_generation=4),
    "grpo-entropy-on-policy": dict(loss_type="grpo", entropy_coef=0.01, steps_per_generation=2),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(DDP_CASES))
def test_ddp_two_ranks_match_stock(launched, case):
    compare(row_results(launched, f"ddp-{case}"), _base({}))


FSDP2_CASES = {
    "untied-head-with-final-norm": dict(tie=False),
    "tied-head": dict(tie=True),
    "untied-head-own-unit": dict(tie=False, head_unit=True),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(FSDP2_CASES))
def test_fsdp2_two_ranks_match_stock(launched, case):
    """accelerate's FSDP2 layout on CPU (see trl_dist_worker.allow_fsdp_on_cpu). With the head in the final norm's
    unit FSDP has unsharded it when the fused forward reads it; as its own unit the head is a sharded DTensor and
    both TRL and fastrl all-gather it exactly once per scoring call."""
    layout = FSDP2_CASES[case]
    results = row_results(launched, f"fsdp2-{case}")
    compare(results, _base(layout))
    for kind, ranks in results.items():
        for r in ranks:
            # scoring inside the training step reads the sharded head; generation (TRL unwraps the model to the full
            # parameters for it) and the first generation, before prepare(), read a full Parameter
            calls = list(zip(r["head"], r["gathers_per_call"]))
            assert any(name == "DTensor" for (name, _), _ in calls), calls
            for (name, numel), (gathers, forwards) in calls:
                # Read sharded (a DTensor outside the forward): a head in its own unit stays sharded inside the
                # forward too and is gathered once per forward (TRL scores in chunks of rows). accelerate's default
                # unit of final norm and head (with the embedding when tied) is unsharded by FSDP before the fused
                # head reads it: no gather. A full Parameter (generation, before prepare()) needs none.
                sharded_inside = name == "DTensor" and layout.get("head_unit")
                assert numel == 32 * 64 // (2 if name == "DTensor" else 1), (kind, calls)
                assert gathers == (forwards if sharded_inside else 0), (kind, calls)


HEAD_TOKENS = [48, 0]  # the head-only row: rank 0 scores 48 completion tokens, rank 1 none


@pytest.mark.slow
def test_zero3_two_ranks_match_stock(launched):
    """DeepSpeed ZeRO-3 on the CPU accelerator (DS_ACCELERATOR=cpu, gloo), every parameter partitioned (numel 0
    outside the forward), with a reference model (beta > 0) that TRL loads from the policy's path under
    `deepspeed.zero.Init`. Inside the reference engine's no-grad forwards fastrl reads that head partitioned and
    gathers it once per forward (TRL scores in chunks of rows), the same on both ranks; the policy's head DeepSpeed
    has gathered when fastrl reads it inside the engine's forward, and fastrl gathers nothing there."""
    results = row_results(launched, "zero3")
    compare(results, _base({}))
    for kind, ranks in results.items():
        assert all(name == "Parameter" and numel == 0 for name, numel in ranks[0]["head"] + ranks[1]["head"]), kind
    ours = results["fastrl"]
    for r in ours:
        reads, gathers = r["reads_per_call"], [g for g, _ in r["gathers_per_call"]]
        assert any(0 in call for call in reads) and any(V * 32 in call for call in reads), reads
        # fastrl gathers exactly the reads it found partitioned (numel 0), one per forward
        assert gathers == [call.count(0) for call in reads], (reads, gathers)
    assert sum(g for g, _ in ours[0]["gathers_per_call"]) > 0
    assert ours[0]["gathers_per_call"] == ours[1]["gathers_per_call"], [r["gathers_per_call"] for r in ours]


@pytest.mark.slow
def test_zero3_head_through_the_engine_forward(launched):
    """fastrl's head on its own in a ZeRO-3 engine's training forward, as TRL calls it: rank 0 scores 48 completion
    tokens, rank 1 none. The head is empty outside the call (numel 0); reading it inside the engine's forward makes
    DeepSpeed gather it (fastrl reads it whole and gathers nothing), and logp, entropy and DeepSpeed's averaged
    d_weight equal the unsharded model's."""
    import trl_dist_worker as worker
    import trl_harness as h

    from fastrl.integrations.trl import add_fastrl_lm_head

    ranks = [torch.load(launched / "zero3-head" / f"zero3-head-rank{r}.pt") for r in (0, 1)]
    assert [(r["outside_numel"], r["reads"], r["gathers"]) for r in ranks] == [(0, [V * 32], 0)] * 2, ranks
    model = add_fastrl_lm_head(h.model(), temperature=0.7)
    d_weight = torch.zeros_like(model.lm_head.weight)
    for rank, r in enumerate(ranks):
        ids, labels = worker.zero3_batch(rank, HEAD_TOKENS[rank])
        out = model(input_ids=ids, labels=labels, fused_lm_head=True)
        (out.log_probs.sum() + 0.1 * out.entropy.sum()).backward()
        torch.testing.assert_close(r["logp"], out.log_probs.detach(), rtol=FP32_TOL, atol=FP32_TOL)
        torch.testing.assert_close(r["entropy"], out.entropy.detach(), rtol=FP32_TOL, atol=FP32_TOL)
        d_weight += model.lm_head.weight.grad / 2  # DeepSpeed averages the ranks' gradients
        model.zero_grad()
    for r in ranks:
        torch.testing.assert_close(r["d_weight"], d_weight, rtol=FP32_TOL, atol=FP32_TOL)


FSDP2_OVERRIDES = {"learning_rate": 0.5, "loss_type": "dapo", "steps_per_generation": 4}
ZERO3_OVERRIDES = {"learning_rate": 0.5, "loss_type": "dapo", "steps_per_generation": 4, "beta": 0.1}


@pytest.fixture(scope="module")
def launched(tmp_path_factory, saved_model):
    """Every case above in one launch. ZeRO-3 comes last (a trainer's ZeRO-3 config, once live, would make the later
    rows build their models under `deepspeed.zero.Init`), its head-only row before its trainers for that reason."""
    ddp = [{"name": f"ddp-{name}", "engine": "ddp", "model_path": saved_model,
            "overrides": {"learning_rate": 0.5, **o}} for name, o in DDP_CASES.items()]  # fmt: skip
    fsdp2 = [{"name": f"fsdp2-{name}", "engine": "fsdp2", **layout, "overrides": FSDP2_OVERRIDES}
             for name, layout in FSDP2_CASES.items()]  # fmt: skip
    zero3 = [{"name": "zero3-head", "engine": "zero3", "head": True, "tokens": HEAD_TOKENS},
             {"name": "zero3", "engine": "zero3", "model_path": saved_model, "overrides": ZERO3_OVERRIDES}]  # fmt: skip
    return launch(tmp_path_factory.mktemp("launch"), ddp + fsdp2 + zero3)


class _Partitioned:
    """What `zero3_partitioned` sees of a ZeRO-3 parameter that is not gathered."""

    ds_id, ds_shape = 7, (V, 32)

    def __init__(self):
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        self.ds_status = ZeroParamStatus.NOT_AVAILABLE


def test_zero3_partitioned_head_gathered_without_grad_refused_with(monkeypatch):
    """A head still partitioned at fastrl's read is gathered around a no-grad call and refused, by shape, when the
    call records gradients (its d_weight would reach a partitioned parameter)."""
    from fastrl.integrations.trl import gather

    entered = []
    monkeypatch.setattr(gather, "gathered", lambda params: entered.append(params) or contextlib.nullcontext())
    param = _Partitioned()
    with torch.no_grad():
        assert gather.zero3_scored(lambda h: h + 1, torch.zeros(2), [param]).tolist() == [1.0, 1.0]
    assert entered == [[param]]
    with pytest.raises(RuntimeError, match=r"\(64, 32\)"):
        gather.zero3_scored(lambda h: h + 1, torch.zeros(2), [param])
