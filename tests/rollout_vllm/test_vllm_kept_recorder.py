"""Our vLLM logits processor that records the kept sets (fastrl/trainer/rollout/vllm_kept.py), without an engine:
vLLM's own truncation on the same logits, records keyed by output position and overwritten, the refusals."""

from types import SimpleNamespace

import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor.interface import BatchUpdate, MoveDirectionality
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

from fastrl.trainer.rollout import vllm_kept

V = 301


def ours(top_k: int, top_p: float) -> SamplingParams:
    return SamplingParams(temperature=0.7, extra_args=vllm_kept.opt_in(top_k, top_p))


def key(params: SamplingParams) -> int:
    return params.extra_args[vllm_kept.EXTRA_KEY]["key"]


def kept(logits_row: torch.Tensor, k: int, p: float) -> set:
    """vLLM's own top-k / top-p on one row: the ids it leaves finite."""
    out = apply_top_k_top_p(logits_row[None].clone(), torch.tensor([k]), torch.tensor([p]))
    return set(out[0].isfinite().nonzero()[:, 0].tolist())


def sets_of(ks) -> list[set]:
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), ks.counts.long().cumsum(0)])
    return [set(ks.ids[starts[t] : starts[t + 1]].tolist()) for t in range(len(ks))]


def test_records_vllms_truncation_by_output_position():
    rec = vllm_kept.KeptSetRecorder(SimpleNamespace(speculative_config=None), torch.device("cpu"), False)
    params = [ours(7, 1.0), ours(0, 0.8), SamplingParams(temperature=0.7)]  # the last is not recorded
    outputs: list[list[int]] = [[], [5, 6], []]
    added = [(i, p, None, o) for i, (p, o) in enumerate(zip(params, outputs))]
    rec.update_state(BatchUpdate(batch_size=3, removed=[], added=added, moved=[]))
    g = torch.Generator().manual_seed(0)
    steps = [torch.randn(3, V, generator=g) * 3 for _ in range(3)]
    out = rec.apply(steps[0].clone())
    ref = apply_top_k_top_p(steps[0].clone(), torch.tensor([7, V, V]), torch.tensor([1.0, 0.8, 1.0]))
    assert torch.equal(out.isfinite(), ref.isfinite()) and torch.equal(out[out.isfinite()], ref[ref.isfinite()])
    rec.apply(steps[1].clone())  # the same positions again (a partial prefill's sample): overwritten
    outputs[0].append(9)
    # rows 0 and 1 swap places in the batch: the records follow their requests
    rec.update_state(BatchUpdate(batch_size=3, removed=[], added=[], moved=[(0, 1, MoveDirectionality.SWAP)]))
    rec.apply(steps[2][[1, 0, 2]].clone())
    assert sets_of(vllm_kept.take(key(params[0]), 2)) == [kept(steps[1][0], 7, 1.0), kept(steps[2][0], 7, 1.0)]
    with pytest.raises(RuntimeError, match="output position 0 of 3"):
        vllm_kept.take(key(params[1]), 3)  # it recorded position 2 only
    assert not vllm_kept.STORE  # taken or dropped


def test_refusals():
    with pytest.raises(ValueError, match="n=1"):
        vllm_kept.KeptSetRecorder.validate_params(SamplingParams(n=2, extra_args=vllm_kept.opt_in(5, 1.0)))
    with pytest.raises(ValueError, match="own must be off"):
        vllm_kept.KeptSetRecorder.validate_params(SamplingParams(top_k=5, extra_args=vllm_kept.opt_in(5, 1.0)))
    vllm_kept.KeptSetRecorder.validate_params(SamplingParams(top_k=5))  # not ours: nothing to check
    with pytest.raises(ValueError, match="speculative decoding"):
        vllm_kept.KeptSetRecorder(SimpleNamespace(speculative_config=object()), torch.device("cpu"), False)
