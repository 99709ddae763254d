"""The step-time model (`bench/async_model.py`): its synchronous sum of phases, K = 0 through the asynchronous
path, the generation bound, and the least-squares fit it calibrates with."""

import pytest

from bench.async_model import Costs, Workload, fit, simulate

COSTS = Costs(step_s=0.01, decode_s=5e-4, prefill_s=5e-5, request_s=1e-3, score_s=0.1, update_s=0.5,
              update_token_s=5e-4, push_s=0.1)  # fmt: skip
MIX = Workload(prompts_per_step=4, group_size=4, prompt_len=20, cap=32, lengths=(2, 3, 5, 8), tail_every=4)


def test_synchronous_step_is_the_sum_of_its_phases():
    P, G, L, N = 4, 4, 6, 5
    work = Workload(P, G, prompt_len=20, cap=L, lengths=(L,), tail_every=0)
    c, n = COSTS, P * G
    generation = n * c.request_s + (c.step_s + c.prefill_s * 20 * n) + (L - 1) * (c.step_s + c.decode_s * n)
    step = generation + c.score_s + c.update_s + c.update_token_s * n * L + c.push_s
    got = simulate(COSTS, work, N).window()
    assert got["wall_s"] == pytest.approx((N - 1) * step, rel=1e-12)
    assert got["trainer_idle"] == pytest.approx((N - 1) * generation / got["wall_s"], rel=1e-12)


def test_staleness_zero_reproduces_the_synchronous_run():
    sync, k0 = simulate(COSTS, MIX, 6).window(), simulate(COSTS, MIX, 6, staleness=0).window()
    assert k0 == pytest.approx(sync, rel=1e-12)
    assert k0["dropped"] == 0 and k0["staleness_mean"] == 0


def test_free_updates_leave_the_generation_bound():
    zero = dict.fromkeys(("request_s", "score_s", "update_s", "update_token_s", "push_s"), 0.0)
    free = Costs(**{**COSTS.__dict__, **zero})
    run = simulate(free, MIX, 12, staleness=1)
    got = run.window()
    assert got["generation_idle"] < 0.02  # the engine never waits for the trainer
    assert got["wall_s"] == pytest.approx(sum(run.gen_busy[1:]), rel=0.02)
    assert got["wall_s"] < simulate(free, MIX, 12).window()["wall_s"]


def test_chunks_keep_staleness_bounded_by_the_admission_rule():
    run = simulate(COSTS, MIX, 10, staleness=1, chunk=16)
    assert 0 < max(run.staleness) <= 1


def test_fit_recovers_a_linear_law():
    rows = [(1.0, d, f) for d in (1, 5, 9, 30) for f in (0, 40, 300)]
    assert fit(rows, [0.2 + 0.03 * d + 0.001 * f for _, d, f in rows]) == pytest.approx([0.2, 0.03, 0.001])


def test_push_waits_for_the_running_engine_step():
    # one 3-token completion per step, engine steps of 1 s, updates of 0.5 s: the second push falls at 4.0 s,
    # inside the engine step 3.5-4.5 that samples the next prompt, and is applied when that step ends
    costs = Costs(step_s=1.0, decode_s=0.0, prefill_s=0.0, request_s=0.0, score_s=0.0, update_s=0.5,
                  update_token_s=0.0, push_s=0.0)  # fmt: skip
    work = Workload(prompts_per_step=1, group_size=1, prompt_len=1, cap=3, lengths=(3,), tail_every=0)
    assert simulate(costs, work, 2, staleness=1).marks == [3.5, 4.5]
