"""The replay path is deterministic and batch-invariant (docs/math.md §9).

Two identical calls agree bit for bit (outputs and every gradient), and a row's log-prob and entropy are the
same bits computed alone, in a batch of 4,096 other rows (127 for the Triton kernels: the interpreter runs
programs one at a time, and a replay program reads nothing of the other rows nor their count) and at another
position, whatever the chunk budget, the SM count (patched to an H100's 132) or FASTRL_AUTOTUNE say. The
interpreter cannot show a race, so the kernels' source is also checked for float atomics and autotuning.
"""

import inspect

import pytest
import torch
import triton
from replay_case import IGNORE, kept_sets, make_case, replayed, run

from fastrl.kernels import configs
from fastrl.kernels.logprobs import replay_bwd, replay_fwd, replay_torch

PROBE = 5


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_two_identical_calls_are_bit_identical(impl):
    case = make_case(n=17, bias=True)
    tau = torch.rand(17, generator=torch.Generator().manual_seed(3)) + 0.5
    first = run(case, impl, temperature=tau, softcap=4.0)
    second = run(case, impl, temperature=tau, softcap=4.0)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def _batch(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    h, w = torch.randn(n, 16, generator=gen), torch.randn(40, 16, generator=gen) * 0.5
    targets = torch.randint(0, 40, (n,), generator=gen)
    targets[1::7] = IGNORE
    ids, offsets, sets = kept_sets(targets, 40, 6, full_rows=(PROBE,), gen=gen)
    return h, w, targets, sets


def _csr(sets):
    return torch.tensor([x for s in sets for x in s], dtype=torch.int64), torch.tensor(
        [0] + [len(s) for s in sets]
    ).cumsum(0)


def _probe_outputs(h, w, targets, sets, rows, impl, at):
    """(logp, entropy) of row PROBE when the call holds `rows` (a list of row indices) and it sits at `at`."""
    ids, offsets = _csr([sets[r] for r in rows])
    out = replayed(h[rows], w, targets[rows], ids, offsets, impl=impl, ignore_index=IGNORE,
                                  temperature=0.9, softcap=3.0)  # fmt: skip
    assert rows[at] == PROBE
    return out.logp[at], out.entropy[at]


@pytest.mark.parametrize(
    "impl, others",
    [("torch", 4096), pytest.param("triton", 127, marks=pytest.mark.slow)],  # ~10 s interpreted
)
def test_a_rows_outputs_do_not_depend_on_the_batch(impl, others, monkeypatch):
    h, w, targets, sets = _batch(others + 1)
    rest = [r for r in range(others + 1) if r != PROBE]
    alone = _probe_outputs(h, w, targets, sets, [PROBE], impl, 0)
    first = _probe_outputs(h, w, targets, sets, [PROBE] + rest, impl, 0)
    last = _probe_outputs(h, w, targets, sets, rest[::-1] + [PROBE], impl, others)
    monkeypatch.setattr(configs, "sm_count", lambda device: 132)
    monkeypatch.setenv("FASTRL_AUTOTUNE", "1")
    monkeypatch.setattr(configs, "autotune_enabled", lambda device: True)
    monkeypatch.setenv("FASTRL_REPLAY_CHUNK_BYTES", "1")  # the torch walk's smallest chunks (16 pairs)
    middle = _probe_outputs(h, w, targets, sets, rest[: others // 2] + [PROBE] + rest[others // 2 :], impl, others // 2)
    for got in (first, last, middle):
        assert torch.equal(got[0], alone[0]) and torch.equal(got[1], alone[1])


def test_replay_kernels_use_no_atomics_and_no_autotuning(monkeypatch):
    for module in (replay_fwd, replay_bwd):
        src = inspect.getsource(module)
        assert "tl.atomic_" not in src, f"{module.__name__} uses a Triton atomic"
    torch_src = inspect.getsource(replay_torch) + inspect.getsource(replay_bwd)
    for name in ("index_add", "scatter_add", "accumulate=True", "index_reduce"):
        assert name not in torch_src, f"the replay walk accumulates with {name}, whose order may vary"
    for kernel in (replay_fwd.replay_fwd_kernel, replay_bwd.replay_dh_kernel, replay_bwd.replay_dw_kernel):
        while hasattr(kernel, "fn"):  # heuristics wrap the JIT function; an autotuner would sit in this chain
            assert not isinstance(kernel, triton.runtime.Autotuner), kernel
            kernel = kernel.fn
    defaults = {k: configs.replay_config(k, torch.device("cpu")) for k in configs.REPLAY_CONFIGS}
    monkeypatch.setenv("FASTRL_AUTOTUNE", "1")
    monkeypatch.setattr(configs, "autotune_enabled", lambda device: True)
    assert {k: configs.replay_config(k, torch.device("cpu")) for k in configs.REPLAY_CONFIGS} == defaults


def test_planted_position_dependent_sum_fails(monkeypatch):
    # row sums by running-sum differences: right to rounding, but their bits depend on what precedes a row
    def cumsum_rows(values, offsets):
        run = torch.cat([values.new_zeros(1), torch.cumsum(values, 0)])
        return run[offsets[1:]] - run[offsets[:-1]]

    monkeypatch.setattr(replay_torch, "row_sums", cumsum_rows)
    with pytest.raises(AssertionError, match="torch.equal"):
        test_a_rows_outputs_do_not_depend_on_the_batch("torch", 4096, monkeypatch)
