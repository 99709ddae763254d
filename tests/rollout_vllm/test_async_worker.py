"""The rollout process of asynchronous training on vLLM's CPU build: one worker engine for the module.

The tests run in file order: the last ones kill the worker, then start an in-process engine (never two vLLM
engines at once on the small test machine).
"""

import copy
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
import torch
from vllm_reference import TOL, alive, hf_logprobs, tiny_config, tiny_pair

from fastrl.trainer.rollout.async_client import AsyncRollout, RolloutWorkerError
from fastrl.trainer.rollout.async_worker import WorkerSpec, request_seed
from fastrl.trainer.rollout.interface import InsertedSpan
from fastrl.trainer.rollout.weight_push import WeightPush
from fastrl.trainer.staleness import VersionSpan
from fastrl.trainer.tiny.export import save_tiny

pytestmark = pytest.mark.slow
SEED = 11
STATE = {}  # what the tests hand on to the later ones


def _span(c) -> tuple[int, int] | None:
    """A completion's one thinking span as (start, end), None when nothing was inserted."""
    assert len(c.inserted) <= 1 and all(s.kind == "thinking" for s in c.inserted), c.inserted
    return tuple(c.inserted[0][:2]) if c.inserted else None


def spec_of(config, path, tokenizer, **kw) -> WorkerSpec:
    fields = dict(model=path, dtype="float32", max_model_len=config.max_prompt_length + config.max_completion_length,
                  seed=config.seed, temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                  min_p=config.min_p, max_tokens=config.max_completion_length, min_tokens=0,
                  stop_ids=(tokenizer.eos_token_id,), kv_cache_bytes=int(0.25 * 2**30))  # fmt: skip
    return WorkerSpec(**{**fields, **kw})


@pytest.fixture(scope="module")
def served():
    config, model, tokenizer = tiny_pair()
    export = tempfile.TemporaryDirectory(prefix="fastrl-tiny-")
    path = save_tiny(model, tokenizer, export.name)
    t = time.monotonic()
    rollout = AsyncRollout(spec_of(config, path, tokenizer), startup_timeout_s=900, timeout_s=120).start()
    print(f"rollout worker ready in {time.monotonic() - t:.1f} s")
    push = WeightPush(rollout, model)
    push.push(0)
    yield config, model, tokenizer, rollout, push, path
    rollout.close()
    export.cleanup()


def wait_parked(rollout, count: int, timeout_s: float = 120) -> None:
    """Until `count` pieces have been parked in all; no group may finish meanwhile."""
    deadline = time.monotonic() + timeout_s
    while len(rollout.parked) < count:
        assert time.monotonic() < deadline, f"{len(rollout.parked)} pieces parked, expected {count}"
        assert not rollout.ready_groups()
        time.sleep(0.05)


@torch.no_grad()
def no_eos_logprobs(model, prompt, completion):
    """Log-probs under the sampler's distribution while min_tokens bans the end token (vLLM masks it)."""
    ids = torch.tensor([prompt + completion])
    logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / tiny_config().temperature
    logits[:, model.config.eos_token_id] = float("-inf")
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def prompts_of(tokenizer):
    return [tokenizer.encode(q, add_special_tokens=True) for q in ("3+4=", "9+9=", "1+8=")]


def test_groups_carry_behaviour_logprobs_versions_and_seeded_tokens(served):
    config, model, tokenizer, rollout, _, _ = served
    prompts, n = prompts_of(tokenizer), 4
    for i, p in enumerate(prompts):
        rollout.submit(i, p, n, SEED)
    groups = sorted((rollout.next_group() for _ in prompts), key=lambda g: g.prompt_id)
    assert [g.prompt_id for g in groups] == [0, 1, 2] and not rollout.in_flight
    for g, p in zip(groups, prompts):
        assert g.prompt_ids == p and len(g.completion_ids) == n
        for ids, lps, spans, cut in zip(g.completion_ids, g.logprobs, g.spans, g.truncated):
            assert spans == (VersionSpan(0, 0, len(ids)),)
            assert cut == (ids[-1] != tokenizer.eos_token_id) and len(ids) <= config.max_completion_length
            ref = hf_logprobs(model, p, ids, temperature=config.temperature)
            assert (ref - torch.tensor(lps)).abs().max() < TOL  # the behaviour log-prob: processed, at temperature
    assert len({tuple(ids) for g in groups for ids in g.completion_ids}) > n  # seeds differ per sample
    rollout.submit(0, prompts[0], n, SEED)  # the same prompt id and seed: the same tokens
    assert rollout.next_group().completion_ids == groups[0].completion_ids
    STATE["tokens"] = {g.prompt_id: g.completion_ids for g in groups}


def test_partial_rollout_continues_under_new_weights_with_stitched_spans(served):
    config, model, tokenizer, rollout, push, _ = served
    prompt, n, chunk, length = prompts_of(tokenizer)[1], 2, 3, 8
    rollout.parked.clear()
    rollout.submit(7, prompt, n, SEED, max_tokens=length, min_tokens=length, chunk_tokens=chunk)
    wait_parked(rollout, n)  # both samples used their first chunk under version 0 and wait
    old = copy.deepcopy(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    push.push(1)  # parked pieces resume under version 1, without the trainer waiting
    wait_parked(rollout, 2 * n)  # their second chunk ran and parked again
    group = rollout.next_group()  # "waiting": the last piece runs under version 1 while the trainer waits
    for ids, lps, spans in zip(group.completion_ids, group.logprobs, group.spans):
        assert len(ids) == length
        assert spans == (VersionSpan(0, 0, chunk), VersionSpan(1, chunk, length))
        lp, before, after = torch.tensor(lps), no_eos_logprobs(old, prompt, ids), no_eos_logprobs(model, prompt, ids)
        assert (before[:chunk] - lp[:chunk]).abs().max() < TOL  # each token's behaviour log-prob: its version's
        assert (after[chunk:] - lp[chunk:]).abs().max() < TOL
        assert (before[chunk:] - lp[chunk:]).abs().max() > 0.05
    assert group.meta["pieces"] == [3, 3]
    model.load_state_dict(old.state_dict())
    push.push(2)


def test_parked_pieces_resume_when_the_trainer_waits(served):
    """Without a new version, pieces continue once the engine idles and the trainer is waiting (no deadlock)."""
    _, _, tokenizer, rollout, _, _ = served
    rollout.submit(8, prompts_of(tokenizer)[2], 2, SEED, max_tokens=6, min_tokens=6, chunk_tokens=2)
    group = rollout.next_group()
    assert group.spans == [(VersionSpan(2, 0, 6),)] * 2 and group.meta["pieces"] == [3, 3]


def test_a_step_over_the_token_budget_prefills_each_prompt_whole(served):
    """12 seeded requests of a 400-token prompt: 4,800 prompt tokens, over the CPU engine's 4,096 a step. A split
    prefill would make vLLM rewind the request's generator, which CPU generators cannot ("CPU Generator does not
    use offset"): the worker runs with chunked prefill off (`whole_prefills`)."""
    _, _, tokenizer, rollout, _, _ = served
    prompt = (prompts_of(tokenizer)[0] * 100)[:400]
    rollout.submit(10, prompt, 12, SEED, max_tokens=2, min_tokens=2)
    group = rollout.next_group()
    assert group.prompt_id == 10 and [len(ids) for ids in group.completion_ids] == [2] * 12


def test_killed_worker_is_reported_within_the_timeout(served):
    _, _, tokenizer, rollout, _, _ = served
    rollout.submit(9, prompts_of(tokenizer)[0], 64, SEED, max_tokens=12, min_tokens=12, chunk_tokens=1)
    os.kill(rollout.pid, signal.SIGKILL)
    t = time.monotonic()
    with pytest.raises(RolloutWorkerError, match="exited with code -9"):
        rollout.next_group()
    assert time.monotonic() - t < 10


def test_kept_sets_recorded_per_piece_replay_vllms_logprobs(served):
    """`replay="recorder"` (vLLM's CPU build): each token's kept set is recorded in the rollout process, one record
    per piece of a partial rollout, concatenated in order, sent as NumPy arrays; replayed by the trainer they give
    vLLM's processed log-probs within 1e-5 per token with every sampled token inside its set (no cutoff flip). The
    same sets one position off (a misalignment) fail it.

    The same engine applies a thinking budget (3 tokens) to a prompt that opens the span, in 2-token chunks with a
    weight push after the first: the budget is counted across the pieces (the second piece asks for 1 token), the
    stop-thinking sentence and closing marker are inserted at token 3, labelled with the version of the token before
    them, with log-prob 0.0 and an empty kept set each (count 0, no ids in the CSR), and the completion goes on."""
    from fastrl.trainer.async_source import completions_of
    from fastrl.trainer.batching import KeptSets, Sample
    from fastrl.trainer.rollout.thinking import find, thinking_budget_of
    from fastrl.trainer.update import StepSettings, sequence_logprobs

    _, model, tokenizer, served_rollout, _, path = served
    assert not served_rollout.process.is_alive()  # never two engines at once
    # two-token markers: the untrained model writes neither by chance
    config = tiny_config(top_p=0.9, top_k=50, min_p=0.02, bf16=False, thinking_budget=3, thinking_stop_text=".",
                         think_start="<think><think>", think_end="</think></think>")  # fmt: skip
    budget = thinking_budget_of(config, tokenizer)
    prompts = prompts_of(tokenizer)
    thinking = tokenizer.encode("3+4=<think><think>", add_special_tokens=True)
    spec = spec_of(config, path, tokenizer, replay="recorder", thinking=budget)
    with AsyncRollout(spec, startup_timeout_s=900, timeout_s=120).start() as rollout:
        push = WeightPush(rollout, model)
        push.push(0)
        rollout.submit(3, thinking, 4, SEED, max_tokens=9, min_tokens=9, chunk_tokens=2)
        wait_parked(rollout, 4)  # each completion's first chunk, under version 0
        push.push(1)  # the same weights as version 1
        rollout.submit(0, prompts[0], 4, SEED)
        rollout.submit(1, prompts[1], 4, SEED, max_tokens=9, min_tokens=9, chunk_tokens=4)  # three pieces each
        rollout.submit(2, prompts[2], 4, SEED, chunk_tokens=3)
        groups = sorted((rollout.next_group() for _ in range(4)), key=lambda g: g.prompt_id)
    assert groups[1].meta["pieces"] == [3] * 4 and max(groups[2].meta["pieces"]) > 1
    for g in groups:
        assert all(ids.dtype.name == counts.dtype.name == "int32" for ids, counts in g.kept)  # arrays, not tensors
    cut = groups[3]
    insert = list(budget.insert_ids)
    assert len(insert) == 3 and cut.meta["pieces"] == [4] * 4  # 2 tokens, 1 (the budget's last), 2 + 3 inserted, 1
    assert cut.inserted == [(InsertedSpan(3, 6, "thinking"),)] * 4
    for g in groups[:3]:  # no span in the prompt: an insertion only where the completion opened one itself
        for ids, spans in zip(g.completion_ids, g.inserted):
            lo, hi, _ = spans[0] if spans else (0, 0, None)
            assert len(spans) <= 1
            assert not spans or (find(ids, budget.start_ids) >= 0 and ids[lo:hi] == insert[: hi - lo])
    for ids, lps, spans, (kept_ids, counts) in zip(cut.completion_ids, cut.logprobs, cut.spans, cut.kept):
        assert len(ids) == 9 and ids[3:6] == insert and lps[3:6] == [0.0] * 3
        assert spans == (VersionSpan(0, 0, 2), VersionSpan(1, 2, 9))
        assert counts[3:6].tolist() == [0, 0, 0] and (counts[:3] >= 1).all() and (counts[6:] >= 1).all()
    comps = completions_of(groups)
    sampled = torch.tensor([_span(c) is None or not _span(c)[0] <= i < _span(c)[1]
                            for c in comps for i in range(len(c.completion_ids))])  # fmt: skip
    vllm = torch.tensor([x for c in comps for x in c.logprobs])
    sizes = torch.cat([c.kept.counts for c in comps])
    assert sizes.numel() == vllm.numel() and (sizes[sampled] >= 1).all() and (sizes[~sampled] == 0).all()
    assert (sizes < len(tokenizer)).float().mean() > 0.5
    settings = StepSettings(config.loss, 1 << 20, False, tokenizer.pad_token_id, impl="torch", bf16=False)

    def gap(kept_of) -> tuple[torch.Tensor, int]:
        samples = [Sample(c.prompt_ids, c.completion_ids, 0.0, kept=kept_of(c.kept)) for c in comps]
        lp = torch.tensor([x for row in sequence_logprobs(model, samples, settings) for x in row])
        outside = 0  # sampled tokens outside their replayed set: the cutoff flipped
        for c, s in zip(comps, samples):
            starts = torch.cat([torch.zeros(1, dtype=torch.int64), s.kept.counts.long().cumsum(0)])
            sets = [s.kept.ids[starts[i] : starts[i + 1]].tolist() for i in range(len(s.kept))]
            lo, hi = _span(c) or (0, 0)
            outside += sum(t not in kept for i, (t, kept) in enumerate(zip(c.completion_ids, sets)) if not lo <= i < hi)
        return (lp - vllm)[sampled].abs(), outside

    err, flips = gap(lambda kept: kept)
    print(f"replayed kept sets: max |vLLM - trainer| = {err.max():.2e} over {err.numel()} tokens, {flips} flips")
    assert err.max() <= 1e-5 and flips == 0

    def one_off(kept: KeptSets) -> KeptSets:  # token t gets token t+1's set (the last keeps its own)
        starts = torch.cat([torch.zeros(1, dtype=torch.int64), kept.counts.long().cumsum(0)])
        sets = [kept.ids[starts[t] : starts[t + 1]] for t in range(len(kept))]
        return KeptSets.of(sets[1:] + sets[-1:])

    assert gap(one_off)[0].max() > 1e-3


def test_worker_tokens_equal_an_in_process_engine_with_the_same_seeds(served):
    """The seeds make a request's tokens independent of the process and the batch it ran in."""
    from vllm import LLM, SamplingParams

    config, _, tokenizer, rollout, _, path = served
    assert not rollout.process.is_alive()  # never two engines at once
    spec = spec_of(config, path, tokenizer)
    llm = LLM(model=path, dtype="float32", max_model_len=spec.max_model_len, seed=spec.seed, enforce_eager=True,
              logprobs_mode="processed_logprobs", kv_cache_memory_bytes=spec.kv_cache_bytes)  # fmt: skip
    try:
        for prompt_id, p in enumerate(prompts_of(tokenizer)):
            params = [
                SamplingParams(
                    temperature=spec.temperature,
                    top_p=spec.top_p,
                    max_tokens=spec.max_tokens,
                    stop_token_ids=list(spec.stop_ids),
                    seed=request_seed(SEED, prompt_id, k),
                )  # fmt: skip
                for k in range(4)
            ]
            outs = llm.generate([{"prompt_token_ids": p}] * 4, params, use_tqdm=False)
            assert [list(o.outputs[0].token_ids) for o in outs] == STATE["tokens"][prompt_id]
    finally:
        del llm


def test_hung_worker_is_reported_within_the_timeout(served):
    config, _, tokenizer, _, _, path = served
    rollout = AsyncRollout(spec_of(config, path, tokenizer), startup_timeout_s=4, timeout_s=4).start(wait=False)
    try:
        rollout._expect("started", 60, "start")
        os.kill(rollout.pid, signal.SIGSTOP)  # alive, silent
        t = time.monotonic()
        with pytest.raises(RolloutWorkerError, match="no heartbeat"):
            rollout._expect("ready", rollout.startup_timeout_s, "start")
        assert time.monotonic() - t < 10
    finally:
        rollout.close()


def test_worker_dies_with_a_killed_trainer(served, tmp_path):
    config, _, tokenizer, _, _, path = served
    spec = spec_of(config, path, tokenizer)
    code = textwrap.dedent(f"""
        import sys, time
        from fastrl.trainer.rollout.async_client import AsyncRollout
        from fastrl.trainer.rollout.async_worker import WorkerSpec
        if __name__ == "__main__":
            r = AsyncRollout(WorkerSpec(**{spec.__dict__!r})).start(wait=False)
            r._expect("started", 60, "start")
            print(r.pid, flush=True)
            time.sleep(600)
    """)
    script = tmp_path / "trainer.py"
    script.write_text(code)
    trainer = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        child = int(trainer.stdout.readline())
        trainer.kill()
        trainer.wait(10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and alive(child):
            time.sleep(0.1)
        assert not alive(child), f"rollout worker {child} outlived its SIGKILLed trainer"
    finally:
        trainer.kill()
