"""Tool tokens (inserted spans of kind "tool") out of every term of the update.

Every completion holds several tool spans. A term that honours the mask cannot see what sits at a tool position:
the tests put wild old / reference / rollout log-probs there ("poison") and require the step's loss, metrics and
gradient to equal those of the same step with plain values there, and counts to be the sampled tokens'. All
completions have one length, so a mask of ones is exactly "the tool mask dropped"; each test's plant drops the mask
from its one term (a monkeypatch) and the test fails.
"""

import pytest
import torch

from fastrl.losses import LossConfig
from fastrl.rewards import batch_accuracy_reward, format_reward
from fastrl.trainer.async_source import completions_of
from fastrl.trainer.batching import KeptSets, Sample, collate
from fastrl.trainer.config import make_config
from fastrl.trainer.rollout import Completion, InsertedSpan
from fastrl.trainer.scoring import (
    Scores,
    reward_text,
    rollout_metrics,
    rollout_sums,
    sampled_length,
    sampled_mask,
    to_samples,
)
from fastrl.trainer.sequence_parallel import SequenceParallel, split_microbatch
from fastrl.trainer.staleness import RolloutGroup, VersionSpan
from fastrl.trainer.tiny import CharTokenizer, tiny_model
from fastrl.trainer.update import StepSettings, sequence_logprobs, train_step

T = 12  # every completion's length
SPANS = [[(2, 5), (8, 10)], [(0, 2), (6, 7), (10, 12)], [(3, 6)], [(1, 3), (5, 8)], [(4, 5), (7, 9)], [(9, 11)]]


def completions() -> list[Completion]:
    g = torch.Generator().manual_seed(0)
    out = []
    for spans in SPANS:
        prompt = [1] + torch.randint(3, 60, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
        ids = torch.randint(3, 60, (T,), generator=g).tolist()
        out.append(Completion(prompt, ids, True, inserted=tuple(InsertedSpan(a, b, "tool") for a, b in spans)))
    return out


def tool_positions() -> torch.Tensor:
    """`[n, T]` bool: the tool tokens."""
    return torch.tensor([[m == 0.0 for m in sampled_mask(c)] for c in completions()])


def pert(i: int, j: int) -> float:
    """How far sample i's token j's old log-prob lies from the model's."""
    return (0.3, -0.25, 0.05)[(i + j) % 3]


def samples(logprobs=None, poison: float = 0.0) -> list[Sample]:
    """The completions as samples; old / ref / rollout log-probs near `logprobs`, `poison` added at tool tokens."""
    adv = [1.0, -0.5, 0.7, -1.2, 0.3, -0.8]
    out = []
    for i, (c, a) in enumerate(zip(completions(), adv)):
        s = Sample(c.prompt_ids, c.completion_ids, a, token_mask=sampled_mask(c))
        if logprobs is not None:
            tool = [m == 0.0 for m in s.token_mask]
            near = [x + pert(i, j) for j, x in enumerate(logprobs[i])]
            s.old_logprobs = [x + poison * t for x, t in zip(near, tool)]
            s.ref_logprobs = [x - 0.4 + poison * t for x, t in zip(near, tool)]
            s.rollout_logprobs = [x + 0.1 - poison * t for x, t in zip(near, tool)]
        out.append(s)
    return out


def step(config: LossConfig, poison: float = 0.0, budget: int = 1 << 20, packed: bool = True, kept=None, old=True):
    """(metrics, minus the gradient) of one SGD(lr=1) step on the samples; on-policy (no log-probs) unless `old`."""
    model = tiny_model(64, hidden_size=32, num_layers=2, num_heads=4, seed=0)
    settings = StepSettings(config, budget, packed, pad_id=0, max_grad_norm=0.0, impl="torch", bf16=False)
    base = sequence_logprobs(model, samples(), StepSettings(LossConfig(), 1 << 20, packed, 0, impl="torch", bf16=False))
    batch = samples(base if old else None, poison)
    if kept is not None:
        for s, sets in zip(batch, kept):
            s.kept = sets
    before = [p.detach().clone() for p in model.parameters()]
    metrics = train_step(model, torch.optim.SGD(model.parameters(), lr=1.0), batch, settings)
    return metrics, [b - p.detach() for b, p in zip(before, model.parameters())]


def assert_blind_to_tool_tokens(config: LossConfig, keys: tuple[str, ...]) -> None:
    """The step with poisoned tool positions equals the plain one: loss, the metrics `keys`, every gradient."""
    plain, g_plain = step(config)
    poisoned, g_poisoned = step(config, poison=6.0)
    assert plain["num_tokens"] == poisoned["num_tokens"] == float((~tool_positions()).sum())
    for key in ("loss", *keys):
        assert poisoned[key] == pytest.approx(plain[key], rel=1e-5, abs=1e-7), key
    for a, b in zip(g_plain, g_poisoned):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
@pytest.mark.parametrize("budget, packed", [(1 << 20, True), (30, True), (30, False)], ids=["one", "packed", "padded"])
def test_loss_and_normalizer_count_sampled_tokens_only(agg, budget, packed):
    """On-policy (ratio 1) the loss is −Σ_i A_i·w_i with w_i from the sampled tokens: token-mean n_i / N, seq-mean-
    token-sum n_i / B, seq-mean-token-mean 1 / B; micro-batched, packed or padded."""
    metrics, _ = step(LossConfig(loss_agg=agg), budget=budget, packed=packed, old=False)
    adv = torch.tensor([s.advantage for s in samples()], dtype=torch.float64)
    n = (~tool_positions()).sum(1).double()
    weight = {"token-mean": n / n.sum(), "seq-mean-token-sum": n / len(n), "seq-mean-token-mean": 1 / len(n)}[agg]
    assert metrics["loss"] == pytest.approx(float(-(adv * weight).sum()), rel=1e-5)
    assert metrics["num_tokens"] == float(n.sum())


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_is_weight_and_its_sequence_sums_skip_tool_tokens(level):
    """A tool token's rollout log-prob (a placeholder: the sampler never scored it) enters no IS weight, per token
    or summed over the sequence."""
    assert_blind_to_tool_tokens(LossConfig(is_cap=2.0, is_level=level), ("is_weight_mean", "clip_frac_high"))


def test_sequence_ratio_skips_tool_tokens():
    """GSPO's sequence ratio: exp of the mean log ratio over the sampled tokens only (ratio_mean weighs each
    sequence's ratio by its sampled tokens)."""
    config = LossConfig(ratio_level="sequence")
    assert_blind_to_tool_tokens(config, ("ratio_mean", "clip_frac_low", "clip_frac_high"))
    sampled = ~tool_positions()
    ratios = [torch.tensor([-pert(i, j) for j in range(T) if row[j]]).mean().exp() * row.sum() for i, row in
              enumerate(sampled)]  # fmt: skip
    assert step(config)[0]["ratio_mean"] == pytest.approx(float(sum(ratios) / sampled.sum()), rel=1e-4)


def test_kl_term_skips_tool_tokens():
    assert_blind_to_tool_tokens(LossConfig(beta=0.1), ("kl_mean",))


def test_clip_fractions_count_sampled_tokens_only():
    """Wild old log-probs at tool tokens would clip them all; the fractions are the sampled tokens'."""
    assert_blind_to_tool_tokens(LossConfig(), ("clip_frac_low", "clip_frac_high", "ratio_mean", "log_ratio_abs_mean"))


def test_entropy_and_its_metric_are_the_sampled_tokens():
    """entropy_mean is the mean entropy over sampled tokens (from the model's own logits), and the entropy bonus
    reads the same tokens."""
    model = tiny_model(64, hidden_size=32, num_layers=2, num_heads=4, seed=0)
    tool, total = tool_positions(), 0.0
    with torch.no_grad():
        for row, s in enumerate(samples()):
            logits = model(torch.tensor([s.prompt_ids + s.completion_ids])).logits[0, len(s.prompt_ids) - 1 : -1]
            h = -(logits.double().softmax(-1) * logits.double().log_softmax(-1)).sum(-1)
            total += float(h[~tool[row]].sum())
    mean = total / float((~tool).sum())
    metrics, _ = step(LossConfig(entropy_coef=0.01))
    assert metrics["entropy_mean"] == pytest.approx(mean, rel=1e-5)
    bonus, _ = step(LossConfig(entropy_coef=0.5, entropy_agg="token-mean"))
    assert bonus["loss"] - step(LossConfig())[0]["loss"] == pytest.approx(-0.5 * mean, rel=1e-4)
    assert_blind_to_tool_tokens(LossConfig(entropy_coef=0.01, entropy_agg="token-mean"), ("entropy_mean",))


def test_replay_kept_sets_are_empty_for_tool_tokens_and_nothing_is_missing():
    """The sampler's kept sets hold nothing for a tool token (it never sampled one): no token counts as missing
    from its set, and the step replays the sampled tokens' sets."""
    kept = []
    for c, tool in zip(completions(), tool_positions().tolist()):
        kept.append(
            KeptSets.of([[] if t else [x, (x + 7) % 64, (x + 19) % 64] for x, t in zip(c.completion_ids, tool)])
        )
    metrics, _ = step(LossConfig(), kept=kept)
    assert metrics["replay_missing_tokens"] == 0.0
    assert metrics["num_tokens"] == float((~tool_positions()).sum())


def _tool_completion(tok, parts) -> Completion:
    """A completion from (text, kind) parts; kind None: sampled."""
    ids, spans = [], []
    for text, kind in parts:
        piece = tok.encode(text)
        if kind is not None:
            spans.append(InsertedSpan(len(ids), len(ids) + len(piece), kind))
        ids += piece
    return Completion([1], ids, False, inserted=tuple(spans))


def test_a_tool_output_earns_no_reward_by_itself():
    """The answer only inside a tool observation gets no accuracy credit; the model's own copy of it does; the
    thinking budget's inserted `</think>` still counts for the format reward."""
    tok = CharTokenizer()
    call = ("<think>" + "6*7 is", None)
    alone = _tool_completion(tok, [call, ("\\boxed{42}", "tool"), ("</think>so it is", None)])
    copied = _tool_completion(tok, [call, ("\\boxed{42}", "tool"), ("</think>\\boxed{42}", None)])
    spelled = _tool_completion(tok, [call, ("4", "tool"), ("</think>\\boxed{4", None), ("2}", "tool")])
    texts = [reward_text(tok, c) for c in (alone, copied, spelled)]
    assert "42" not in texts[0] and batch_accuracy_reward(texts, ["42"] * 3) == [0.0, 1.0, 0.0]
    plain = _tool_completion(tok, [("<think>" + "6*7 is 42", None), ("</think>", "thinking"), ("\\boxed{42}", None)])
    assert reward_text(tok, plain) == tok.decode(plain.completion_ids, skip_special_tokens=True)
    assert format_reward(reward_text(tok, plain)) == 1.0 and batch_accuracy_reward([reward_text(tok, plain)], ["42"])


def test_the_trainers_scoring_stage_reads_the_reward_text_and_the_sampled_lengths():
    """`stages.score_batch`, as the loop calls it: the group whose only answer is a tool's output scores 0, the one
    whose model copied it scores 1; the longest response counts sampled tokens."""
    from fastrl.trainer.preflight import build_reward
    from fastrl.trainer.scoring import ScoringSettings
    from fastrl.trainer.stages import score_batch
    from fastrl.trainer.tasks import Problem

    tok = CharTokenizer()
    call = ("<think>6*7</think>", None)  # the answer part: the accuracy reward reads what follows the thinking
    alone = _tool_completion(tok, [call, ("\\boxed{42}", "tool"), ("so it is", None)])
    copied = _tool_completion(tok, [call, ("\\boxed{42}", "tool"), ("\\boxed{42}", None)])
    config = make_config(group_size=2, advantage_scale="none", rewards=("accuracy:1.0",))
    _, metrics = score_batch([alone, copied], [Problem("6*7=", "42")], ScoringSettings.from_config(config),
                             build_reward(config), tok)  # fmt: skip
    assert metrics["reward_correct_mean"] == 0.5
    assert metrics["response_length_max"] == max(sampled_length(c) for c in (alone, copied))


def test_response_length_counts_sampled_tokens_and_inserted_ones_apart():
    comps = completions()
    comps[0] = Completion(comps[0].prompt_ids, comps[0].completion_ids, True, inserted=(*comps[0].inserted,
                          InsertedSpan(11, 12, "thinking")))  # fmt: skip
    config = make_config(group_size=2, thinking_budget=4)
    scores = Scores(torch.zeros(6, dtype=torch.float64), [0.0] * 6, {})
    sums = rollout_sums(comps, [len(c.prompt_ids) for c in comps[::2]], scores, torch.zeros(3), config)
    metrics = rollout_metrics(sums, max(sampled_length(c) for c in comps))
    inserted = int(tool_positions().sum())
    assert metrics["response_length_mean"] == (6 * T - inserted - 1) / 6
    assert metrics["inserted_tokens"] == inserted + 1 and metrics["thinking_budget_inserted_tokens"] == 1
    assert metrics["response_length_max"] == max(T - len([t for t in row if t]) for row in tool_positions().tolist())
    assert metrics["rollout_tokens"] == 6 * T + sum(len(c.prompt_ids) for c in comps[::2]) * 2


@pytest.mark.parametrize("n", [2, 3])
def test_sequence_parallel_blocks_carry_the_tool_mask(n):
    """Each rank's block of a packed micro-batch masks exactly its tool tokens; the blocks' masks partition the
    sampled tokens (the token-mean normalizer counts each once)."""
    batch = samples()
    mb = collate(batch, packed=True, pad_id=0)
    blocks = [split_microbatch(mb, SequenceParallel(n, r, None, 1, 0, None)) for r in range(n)]
    whole = torch.zeros(len(batch), T)
    for r, block in enumerate(blocks):
        for i, (t0, t1) in enumerate(block["spans"][r].tolist()):
            whole[i, t0:t1] += block["mask"][i, : t1 - t0]
    assert whole.tolist() == [s.token_mask for s in batch]
    assert sum(float(b["mask"].sum()) for b in blocks) == float((~tool_positions()).sum())


def test_async_groups_carry_tool_spans_into_the_samples():
    """A rollout group's tool spans reach the completions (`completions_of`) and their samples' token masks."""
    comps = completions()
    ids, spans = [c.completion_ids for c in comps[:2]], [c.inserted for c in comps[:2]]
    group = RolloutGroup(7, comps[0].prompt_ids, ids, [[-1.0] * T] * 2, [(VersionSpan(0, 0, T),)] * 2, [True, True],
                         inserted=spans)  # fmt: skip
    got = completions_of([group])
    assert [c.inserted for c in got] == [c.inserted for c in comps[:2]]
    config = make_config(group_size=2)
    out = to_samples(got, [1.0, -1.0], torch.zeros(1, dtype=torch.bool), config)
    assert [s.token_mask for s in out] == [sampled_mask(c) for c in comps[:2]]
    assert all(0.0 in s.token_mask for s in out)


@pytest.mark.parametrize(
    "spans, match",
    [
        ((InsertedSpan(2, 5, "tool"), InsertedSpan(4, 6, "tool")), "overlaps the one before"),
        ((InsertedSpan(8, 13, "tool"),), "outside its 12 tokens"),
        ((InsertedSpan(1, 2, "observation"),), "of kind"),
        (((1, 2),), "is not an InsertedSpan"),
    ],
    ids=["overlap", "past-the-end", "unknown-kind", "plain-tuple"],
)
def test_bad_spans_are_refused_where_they_are_made(spans, match):
    with pytest.raises(ValueError, match=match):
        Completion([1], list(range(3, 15)), False, inserted=spans)
    with pytest.raises(ValueError, match=match):
        RolloutGroup(0, [1], [list(range(3, 15))], [[0.0] * 12], [(VersionSpan(0, 0, 12),)], [False], inserted=[spans])
