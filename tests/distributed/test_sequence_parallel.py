"""Sequence parallelism (Ulysses) on 2 gloo ranks equals the 1-process update.

One launch runs every case: Qwen2 models built from config (4 attention heads; 2 key/value heads, and 1,
which is then replicated; q/k/v biases; an untied head), packed and padded micro-batches of unequal
lengths (odd widths: the last block is padded), with and without FSDP2. Each case takes 2 AdamW steps
with sequence parallel 2 (`train_step` and `sequence_logprobs` with `StepSettings(sequence=...)`) and
compares, with the 1-process `train_step` on the same samples, the loss and
entropy of each step, the gradients, the parameters after them and the per-token log-probs. The same
launch reruns one case with each bug of `PLANTS` monkeypatched in and those results must differ, and sums a
bf16 head's gradient over the group (in float32; a sum planted in bf16 must differ).

The replay cases give every completion token the set a top-k 6 + top-p 0.9 sampler keeps from the initial
model (docs/math.md §9), its target added, except one token whose target is left out (`replay_missing_tokens`
must be 1 on both runs, counted once); each rank's block then carries its tokens' sets. Ranks holding different
sets are refused by the same-rollout check.
"""

import dataclasses

import pytest
import torch
from _batches import qwen2
from _spawn import spawn

from fastrl.kernels import take_weight_gradient
from fastrl.losses import LossConfig, grpo_loss
from fastrl.trainer import sequence_parallel as seqpar
from fastrl.trainer import update
from fastrl.trainer.batching import KeptSets, Sample, collate
from fastrl.trainer.fsdp import shard_model
from fastrl.trainer.sequence_parallel import (
    SequenceParallel,
    check_same_rollouts,
    check_token_local,
    init_sequence_parallel,
    split_microbatch,
)
from fastrl.trainer.ulysses import ATTENTION, check_heads, ulysses
from fastrl.trainer.update import StepSettings, sequence_logprobs, train_step

CONFIG = LossConfig(loss_agg="token-mean", eps_high=0.28)
REPLAY = LossConfig(loss_agg="token-mean", eps_high=0.28, top_k=6, top_p=0.9)  # the sampler the kept sets follow
BUDGET = 40
V = 64
CASES = [  # (name, key/value heads, packed, fsdp, replay the kept sets)
    ("gqa-packed", 2, True, False, False),
    ("mqa-padded", 1, False, False, False),
    ("gqa-padded-fsdp", 2, False, True, False),
    ("mqa-packed-fsdp", 1, True, True, False),
    ("gqa-packed-replay", 2, True, False, True),
    ("mqa-padded-fsdp-replay", 1, False, True, True),
]


def _labels_shifted_within_the_block(mp):
    real = seqpar._shard_labels

    def planted(input_ids, sp, block):
        ids, _ = real(input_ids, sp, block)
        return ids, ids.roll(-1, 1)

    mp.setattr(seqpar, "_shard_labels", planted)


def _positions_restarted_in_every_block(mp):
    mp.setattr(seqpar, "_shard_positions", lambda ids, sp, block: torch.arange(block).expand(ids.shape[0], block))


def _normalizer_of_the_block_alone(mp):
    real = update.step_normalizer
    mp.setattr(update, "step_normalizer", lambda *args: real(*args[:-1], dataclasses.replace(args[-1], size=1)))


def _head_rows_all_at_the_first_block(mp):
    real = seqpar.HeadGradientRows.add_to

    def planted(self, weight):
        self.sp = dataclasses.replace(self.sp, rank=0)
        real(self, weight)

    mp.setattr(seqpar.HeadGradientRows, "add_to", planted)


def _head_rows_summed_in_bf16(mp):
    real = seqpar.dist.reduce

    def planted(tensor, *args, **kwargs):
        low = tensor.bfloat16()
        work = real(low, *args, **kwargs)
        tensor.copy_(low)
        return work

    mp.setattr(seqpar.dist, "reduce", planted)


PLANTS = {  # bugs the comparison must catch, monkeypatched into the ranks one at a time
    "labels": _labels_shifted_within_the_block,
    "positions": _positions_restarted_in_every_block,
    "normalizer": _normalizer_of_the_block_alone,
    "head_rows": _head_rows_all_at_the_first_block,
}


def batch() -> list[Sample]:
    """Seven samples of unequal lengths (odd and even), one of them masked out of the loss. The longest has
    its first completion token predicted by the last position of a block (packed), and is alone in a padded
    micro-batch whose first block predicts no completion token."""
    g = torch.Generator().manual_seed(3)
    out = []
    for i, (p, c) in enumerate([(4, 9), (3, 14), (6, 5), (5, 12), (3, 7), (4, 10), (20, 3)]):
        ids = torch.randint(3, V, (p + c,), generator=g).tolist()
        out.append(Sample(ids[:p], ids[p:], float(torch.randn(1, generator=g)), loss_mask=i != 4))
    return out


def replay_batch() -> list[Sample]:
    """`batch()` with each completion token's kept set: what top-k 6 then top-p 0.9 keep of the initial GQA
    model's distribution, plus the target; sample 1's third token misses its target."""
    model, out = qwen2(2), batch()
    for i, s in enumerate(out):
        with torch.no_grad():
            logits = model(torch.tensor([s.prompt_ids + s.completion_ids])).logits[0, len(s.prompt_ids) - 1 : -1]
        top, ids = logits.softmax(-1).topk(6)
        top = top / top.sum(-1, keepdim=True)
        sets = []
        for t, target in enumerate(s.completion_ids):
            kept = set(ids[t][top[t].cumsum(0) - top[t] < 0.9].tolist()) | {target}
            sets.append(sorted(kept - {target} if (i, t) == (1, 2) else kept))
        s.kept = KeptSets.of(sets)
    return out


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


class KeepGrads(torch.optim.AdamW):
    """AdamW that records the full gradients of every step when they are cleared."""

    def zero_grad(self, set_to_none=True):
        grads = {n: p.grad for n, p in self.model.named_parameters() if p.grad is not None}
        if grads:
            self.grads.append({n: _full(g) for n, g in grads.items()})
        super().zero_grad(set_to_none=set_to_none)


def _optimizer(model):
    # eps 1e-6, not 1e-8: some gradient entries are ~1e-10 (rounding noise of a zero), and AdamW's step
    # lr·g/(|g| + eps) would turn their last-bit differences into parameter differences of lr·15%
    opt = KeepGrads(model.parameters(), lr=1e-3, eps=1e-6)
    opt.model, opt.grads = model, []
    return opt


def settings(packed: bool, sp: SequenceParallel | None = None, replay: bool = False) -> StepSettings:
    return StepSettings(REPLAY if replay else CONFIG, BUDGET, packed, 0, sequence=sp)


def run_case(kv_heads, packed, fsdp, sp, replay=False):
    model = qwen2(kv_heads)
    if fsdp:
        model = shard_model(model)
    opt = _optimizer(model)
    samples = replay_batch() if replay else batch()
    steps = [train_step(model, opt, samples, settings(packed, sp, replay)) for _ in range(2)]
    logp = sequence_logprobs(model, samples, settings(packed, sp, replay))
    params = {n: _full(p) for n, p in model.named_parameters()}
    return dict(steps=steps, grads=opt.grads, params=params, logp=logp), model


def _worker(rank, world, out_dir):
    with pytest.raises(ValueError, match="sequence_parallel=3 does not divide the world size 2"):
        init_sequence_parallel(3)
    sp = init_sequence_parallel(2)
    results = {}
    for name, kv, packed, fsdp, replay in CASES:
        results[name], model = run_case(kv, packed, fsdp, sp, replay)
        if name == "gqa-packed":  # generate inside the context runs the model's own attention
            prompt = torch.tensor([batch()[0].prompt_ids])
            before = model.generate(prompt, max_new_tokens=4, do_sample=False)
            with ulysses(model, sp):
                inside = model.generate(prompt, max_new_tokens=4, do_sample=False)
            results["generate"] = (before, inside, model.config._attn_implementation)
    for plant, install in PLANTS.items():
        with pytest.MonkeyPatch.context() as mp:
            install(mp)
            results[plant] = run_case(2, True, False, sp)[0]
    results["bf16_head_rows"] = bf16_head_rows(sp)
    samples = replay_batch()
    check_same_rollouts(samples, sp)
    if rank == 1:  # one token's set differs on one rank
        samples[0].kept = KeptSets.of([[9]] + [[t] for t in samples[0].completion_ids[1:]])
    with pytest.raises(RuntimeError, match="different rollouts"):
        check_same_rollouts(samples, sp)
    with pytest.MonkeyPatch.context() as mp:
        _head_rows_summed_in_bf16(mp)
        results["bf16_head_rows_planted"] = bf16_head_rows(sp)
    torch.save(results, f"{out_dir}/rank{rank}.pt")


def bf16_head_rows(sp):
    """A bf16 head's gradient through `HeadGradientRows`: (this rank's rows of the group's sum, the float32 sum
    of every rank's bf16 gradient at those rows)."""
    g = torch.Generator().manual_seed(10 + sp.rank)
    hidden = torch.randn(1, 16, 32, generator=g).bfloat16().requires_grad_()
    weight = torch.randn(V, 32, generator=torch.Generator().manual_seed(9)).bfloat16().requires_grad_()
    targets = torch.randint(0, V, (1, 16), generator=g)

    def loss():
        return grpo_loss(hidden, weight, targets, torch.ones(1, 16, dtype=torch.bool), torch.ones(1), config=CONFIG,
                         impl="torch").loss  # fmt: skip

    mine = take_weight_gradient(loss()).float()
    parts = [torch.empty_like(mine) for _ in range(sp.size)]
    torch.distributed.all_gather(parts, mine, group=sp.group)
    rows = seqpar.HeadGradientRows(sp)
    rows.take(loss())
    return rows.rows, torch.tensor_split(sum(parts), sp.size)[sp.rank]


def reference(kv_heads, packed, replay=False):
    model = qwen2(kv_heads)
    opt = _optimizer(model)
    samples = replay_batch() if replay else batch()
    steps = [train_step(model, opt, samples, settings(packed, replay=replay)) for _ in range(2)]
    logp = sequence_logprobs(model, samples, settings(packed, replay=replay))
    return dict(steps=steps, grads=opt.grads, params={n: p.detach() for n, p in model.named_parameters()}, logp=logp)


def mismatches(got: dict, ref: dict) -> list[str]:
    """What differs beyond float32 rounding: step losses / entropies, gradients, parameters, log-probs."""
    bad = []

    def close(a, b, what):
        try:
            torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), rtol=1e-5, atol=1e-6)
        except AssertionError as e:
            bad.append(f"{what}: {str(e).splitlines()[-2:]}")

    for s, (g, r) in enumerate(zip(got["steps"], ref["steps"])):
        close(g["loss"], r["loss"], f"step {s} loss")
        close(g["entropy_mean"], r["entropy_mean"], f"step {s} entropy")
        if g["replay_missing_tokens"] != r["replay_missing_tokens"]:
            bad.append(f"step {s} replay_missing_tokens: {g['replay_missing_tokens']} != {r['replay_missing_tokens']}")
    for s, (g, r) in enumerate(zip(got["grads"], ref["grads"])):
        for name in r:
            close(g[name], r[name], f"step {s} grad {name}")
    for name, p in ref["params"].items():
        close(got["params"][name], p, f"param {name}")
    for i, (g, r) in enumerate(zip(got["logp"], ref["logp"])):
        close(g, r, f"logp of sample {i}")
    return bad


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sequence_parallel_2_equals_one_process(tmp_path):
    spawn(_worker, 2, tmp_path, str(tmp_path))
    torch.set_num_threads(1)
    got = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    refs = {(kv, packed, replay): reference(kv, packed, replay) for _, kv, packed, _, replay in CASES}
    for name, kv, packed, _, replay in CASES:
        ref = refs[kv, packed, replay]
        assert [s["replay_missing_tokens"] for s in ref["steps"]] == ([1.0, 1.0] if replay else [0.0, 0.0])
        for r in range(2):
            assert not mismatches(got[r][name], ref), (name, r, mismatches(got[r][name], ref))
    before, inside, impl = got[0]["generate"]
    assert torch.equal(before, inside) and impl == "sdpa"
    for plant in PLANTS:  # each planted bug must be caught by the same comparison
        assert mismatches(got[0][plant], refs[2, True, False]), plant
    for r in range(2):  # a bf16 head's gradient is summed over the group in float32
        rows, expected = got[r]["bf16_head_rows"]
        torch.testing.assert_close(rows, expected, rtol=1e-6, atol=0)
        rows, expected = got[r]["bf16_head_rows_planted"]  # summed in bf16
        assert not torch.allclose(rows, expected, rtol=1e-6, atol=0)


def test_split_labels_cross_blocks_and_heads_refused():
    """The target of a block's last position is the first token of the next block; bad head counts and
    whole-sequence loss terms are refused with the values named."""
    samples = batch()[:3]
    mb = collate(samples, True, 0)
    blocks = [split_microbatch(mb, SequenceParallel(2, r, None, 1, 0, None)) for r in range(2)]
    width = mb["input_ids"].shape[1]
    assert width % 2 == 1 and all(b["input_ids"].shape[1] == (width + 1) // 2 for b in blocks)
    for key in ("targets", "mask"):
        whole = torch.zeros_like(mb[key])
        for r, b in enumerate(blocks):
            for i in range(len(samples)):
                t0, t1 = b["spans"][r, i].tolist()
                whole[i, t0:t1] = b[key][i, : t1 - t0]
        torch.testing.assert_close(whole, mb[key])
    assert torch.equal(blocks[1]["position_ids"][0, :3], mb["position_ids"][0, (width + 1) // 2 :][:3])
    with pytest.raises(ValueError, match="sequence_parallel=3 must divide the model's 4 attention heads"):
        check_heads(4, 2, 3)
    with pytest.raises(ValueError, match="sequence_parallel=4 and the model's 6 key/value heads"):
        check_heads(12, 6, 4)
    with pytest.raises(ValueError, match="ratio_level='sequence'"):
        check_token_local(LossConfig(ratio_level="sequence"))
    with pytest.raises(ValueError, match="needs a process group"):
        init_sequence_parallel(2)
    assert ATTENTION not in str(qwen2(1).config._attn_implementation)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_split_gives_each_block_its_tokens_kept_sets(packed):
    """Each block's CSR holds exactly its tokens' sets (offsets from 0), and the blocks' missing flags add up to
    the micro-batch's."""
    mb = collate(replay_batch(), packed, 0)
    tc = mb["targets"].shape[1]

    def token_set(ids, offsets, k):
        return ids[offsets[k] : offsets[k + 1]].tolist()

    missing = torch.zeros_like(mb["kept_missing"])
    for r in range(2):
        b = split_microbatch(mb, SequenceParallel(2, r, None, 1, 0, None))
        ids, offsets, width = b["kept_ids"], b["kept_offsets"], b["targets"].shape[1]
        assert offsets[0] == 0 and offsets[-1] == ids.numel() and offsets.numel() == b["targets"].numel() + 1
        for i in range(len(b["spans"][r])):
            t0, t1 = b["spans"][r, i].tolist()
            for j in range(width):
                want = token_set(mb["kept_ids"], mb["kept_offsets"], i * tc + t0 + j) if j < t1 - t0 else []
                assert token_set(ids, offsets, i * width + j) == want, (r, i, j)
            missing[i, t0:t1] |= b["kept_missing"][i, : t1 - t0]
    assert torch.equal(missing, mb["kept_missing"]) and int(missing.sum()) == 1
