"""The kept set of every token vLLM samples, for the loss to replay (docs/math.md §9). Imported with vLLM only.

Two ways, alternatives (vLLM's sampling mask refuses custom logits processors):

- Model Runner V2 (GPU): `LLM(return_sampling_mask=True)`; each `CompletionOutput.sampling_mask` holds one list of
  kept ids per generated token (it needs top_k > 0), turned into a `KeptSets` by `fastrl.kept_set_from_vllm`.
- The V1 model runner (vLLM's CPU build, where V2 cannot start): `KeptSetRecorder`, a V1 logits processor. vLLM's
  sampler divides by the temperature, runs its argmax-invariant processors in order (its min-p, then this one)
  and then its top-k / top-p. The recorder applies the request's top-k / top-p itself, with vLLM's own
  `apply_top_k_top_p` and in its order, and keeps the ids left finite (min-p's, and the other processors' -inf,
  min_tokens, bad words and logit bias, included); the request's own top_k / top_p are off, so nothing after it
  drops a token and `processed_logprobs` is the log-softmax over exactly the recorded set.

A request opts in through `SamplingParams.extra_args[EXTRA_KEY] = {"key", "top_k", "top_p"}`, one request per
completion (n = 1). A record is keyed by its output position (the length of the request's output so far) and
overwritten by a later sample at the same position: vLLM discards the sample of a partial prefill. Records stay in
this process (`STORE`), so the engine core must run here (VLLM_ENABLE_V1_MULTIPROCESSING=0, as the trainer's
engine runs); `collect` takes them out after `generate`.
"""

import itertools

import torch
from vllm.v1.sample.logits_processor import LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

from fastrl.kernels import kept_set_from_vllm

from ..batching import KeptSets

EXTRA_KEY = "fastrl_kept_set"
STORE: dict[int, dict[int, torch.Tensor]] = {}  # request key -> {output position: kept ids, int32}
_keys = itertools.count()


def opt_in(top_k: int, top_p: float) -> dict:
    """The `extra_args` of one request whose kept sets the recorder keeps under a new key."""
    return {EXTRA_KEY: {"key": next(_keys), "top_k": int(top_k), "top_p": float(top_p)}}


class KeptSetRecorder(LogitsProcessor):
    """Applies an opted-in request's top-k / top-p (vLLM's code and order) and records the ids it leaves finite."""

    @classmethod
    def validate_params(cls, params) -> None:
        spec = (params.extra_args or {}).get(EXTRA_KEY)
        if spec is None:
            return
        if params.n != 1:
            raise ValueError(f"a kept-set request samples one completion (n=1), got n={params.n}")
        if params.top_k not in (0, -1) or params.top_p < 1:
            raise ValueError(f"a kept-set request applies top_k / top_p itself: the request's own must be off, got "
                             f"top_k={params.top_k}, top_p={params.top_p}")  # fmt: skip

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        if getattr(vllm_config, "speculative_config", None) is not None:
            raise ValueError("the kept-set recorder does not support speculative decoding (a verified token was "
                             "drawn from the draft's distribution, not from the set recorded)")  # fmt: skip
        self.requests: dict[int, tuple[int, int, float, list[int]]] = {}  # batch row -> (key, k, p, output ids)

    def is_argmax_invariant(self) -> bool:
        return True  # top-k / top-p keep the most likely token: greedy rows skip it, sampled rows run it last

    def update_state(self, batch_update) -> None:
        process_dict_updates(self.requests, batch_update, self._new)

    @staticmethod
    def _new(params, prompt_ids, output_ids):
        spec = (params.extra_args or {}).get(EXTRA_KEY)
        return None if spec is None else (spec["key"], spec["top_k"], spec["top_p"], output_ids)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.requests:
            return logits
        rows = sorted(self.requests)
        specs = [self.requests[r] for r in rows]
        vocab = logits.shape[1]
        index = torch.tensor(rows, device=logits.device)
        k = torch.tensor([s[1] if 0 < s[1] < vocab else vocab for s in specs], device=logits.device)
        p = torch.tensor([s[2] for s in specs], dtype=torch.float32, device=logits.device)
        sub = apply_top_k_top_p(logits[index], None if bool((k == vocab).all()) else k,
                                None if bool((p >= 1).all()) else p)  # fmt: skip
        logits[index] = sub
        kept = sub.isfinite().cpu()
        for row, (key, _, _, output_ids) in enumerate(specs):
            STORE.setdefault(key, {})[len(output_ids)] = kept[row].nonzero().squeeze(1).to(torch.int32)
        return logits


def take(key: int, n: int) -> KeptSets:
    """The recorded sets of request `key`'s `n` tokens, removed from the store; RuntimeError when one is missing."""
    records = STORE.pop(key, {})
    missing = [t for t in range(n) if t not in records]
    if missing:
        raise RuntimeError(
            f"no kept set was recorded for output position {missing[0]} of {n} (of {len(missing)} in all): is "
            "vLLM's engine core in another process (VLLM_ENABLE_V1_MULTIPROCESSING must be 0)?"
        )
    return KeptSets.of([records[t] for t in range(n)])


def discard(keys) -> None:
    """Forget the records of requests that will not be taken (a failed or interrupted generate)."""
    for key in keys:
        STORE.pop(key, None)


def from_sampling_mask(mask, n: int) -> KeptSets:
    """A completion's `SamplingMask` (vLLM with `return_sampling_mask=True`) for its `n` tokens as a `KeptSets`."""
    if mask is None:
        raise RuntimeError("vLLM returned no sampling_mask: was the engine started with return_sampling_mask=True?")
    ids, offsets = kept_set_from_vllm([mask], torch.ones(1, n, dtype=torch.bool))
    return KeptSets(ids, offsets.diff().to(torch.int32))
