"""The Hugging Face `generate` engine: samples with the training model itself (CPU, or GPU without vLLM).

With `--sampler-replay` (the default where something is truncated) the engine records each token's kept set: the
temperature, top-k, top-p and min-p warpers run inside `_KeptSetRecorder`, in generate's own order and after the
row processors (`_EndSuppressed`), and the ids they leave finite are the set the token was drawn from. With tools a
row stops at the token that closes a tool call (`_CallClosed`), where the tool loop cuts it.
"""

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    MinPLogitsWarper,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ..batching import KeptSets
from .interface import Completion
from .sampling import SamplingEngine, resolve_replay
from .thinking import Request, Sampled, sample_with_budget
from .tool_turns import sample_with_tools


def trim_completion(ids: list[int], eos_ids: set[int]) -> tuple[list[int], bool]:
    """Cut generated ids after the first end token (generate pads finished rows). Returns (ids, truncated).

    A row without one ran the full `max_new_tokens` (generate stops early only when every row is done).
    """
    for i, t in enumerate(ids):
        if t in eos_ids:
            return ids[: i + 1], False
    return ids, True


class _EndSuppressed(LogitsProcessor):
    """No end token while a row has sampled fewer than its `min_new` tokens (per row, unlike generate's own)."""

    def __init__(self, width: int, min_new: list[int], eos_ids: list[int]):
        self.width, self.min_new, self.eos_ids = width, torch.tensor(min_new), eos_ids

    def __call__(self, input_ids, scores):
        early = (input_ids.shape[1] - self.width < self.min_new.to(scores.device)).nonzero()[:, 0]
        scores[early[:, None], torch.tensor(self.eos_ids, device=scores.device)] = -float("inf")
        return scores


class _KeptSetRecorder(LogitsProcessor):
    """The sampling warpers (temperature, top-k, top-p, min-p: generate's order), then a record of the ids each row
    kept (its finite scores). generate runs a passed processor before its own warpers, so the engine turns those
    off and this one applies them: the recorded set is exactly the one sampled from."""

    def __init__(self, sampler):
        self.warpers = [TemperatureLogitsWarper(sampler.temperature)]
        self.warpers += [TopKLogitsWarper(sampler.top_k)] if sampler.top_k is not None else []
        self.warpers += [TopPLogitsWarper(sampler.top_p)] if sampler.top_p is not None else []
        self.warpers += [MinPLogitsWarper(sampler.min_p)] if sampler.min_p is not None else []
        self.steps: list[tuple[torch.Tensor, list[int]]] = []  # per step: (kept ids row after row, row starts)

    def __call__(self, input_ids, scores):
        for warp in self.warpers:
            scores = warp(input_ids, scores)
        kept = scores.isfinite()
        starts = [0] + kept.sum(1).cumsum(0).tolist()
        self.steps.append((kept.nonzero()[:, 1].to(torch.int32).cpu(), starts))
        return scores

    def sets(self, row: int, n: int) -> KeptSets:
        """Row `row`'s kept sets for its first `n` sampled tokens."""
        return KeptSets.of([ids[starts[row] : starts[row + 1]] for ids, starts in self.steps[:n]])


class _RowLimit(StoppingCriteria):
    """A row is done once it has sampled its own `limit` tokens."""

    def __init__(self, width: int, limits: list[int]):
        self.width, self.limits = width, torch.tensor(limits)

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids.shape[1] - self.width >= self.limits.to(input_ids.device)


class _CallClosed(StoppingCriteria):
    """A row is done once its new tokens close a tool call (`ToolTurns.find_call`); `closed_at[row]`: its new tokens
    then (the tool loop cuts there anyway: this only spares sampling past it). Decodes a row only when its last
    token ends like a call's closing marker."""

    def __init__(self, width: int, turns, rows: int):
        self.width, self.turns, self.closed_at = width, turns, [None] * rows
        self.tail = "`" if turns.fmt == "code" else ">"

    def __call__(self, input_ids, scores, **kwargs):
        decode = self.turns.tokenizer.decode
        for row, ids in enumerate(input_ids[:, self.width :].tolist()):
            if self.closed_at[row] is None and decode(ids[-1:]).endswith(self.tail):
                # the prompt (its left padding is passed over by the parser's anchor) tells the hermes parser where
                # the turn starts: a call the model only mentions inside a template-opened <think> is no call
                prefix = decode(input_ids[row, : self.width].tolist()) if self.turns.fmt == "hermes" else ""
                if self.turns.find_call(decode(ids), prefix) is not None:
                    self.closed_at[row] = len(ids)
        return torch.tensor([at is not None for at in self.closed_at], device=input_ids.device)


class HFEngine(SamplingEngine):
    """Sampling with `model.generate` on the training model itself (CPU, or GPU without vLLM).

    Prompts are left-padded; the model computes positions from the attention mask, so a padded prompt
    samples exactly like an unpadded one. With a thinking budget (`thinking.py`) or tools (`tool_turns.py`) it
    samples in rounds.
    """

    def __init__(self, model, tokenizer, config):
        super().__init__(model, tokenizer, config)
        self.model = model
        s = self.sampler
        if s.min_p is not None and s.top_p is not None:
            # transformers applies min-p after top-p, vLLM (whose order the loss follows) before it
            raise ValueError(f"the hf engine samples min_p={s.min_p} after top_p={s.top_p}, unlike vLLM and the "
                             "loss: use one of them, or the vllm engine")  # fmt: skip
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.replay = resolve_replay(config, None)  # this engine can always record them
        # Our own config, swapped in during generate: transformers fills "unset" fields of a passed config
        # from model.generation_config, so a model default (top_k, repetition_penalty, ...) would otherwise
        # change the sampling distribution away from the one the loss scores (softmax(logits / T), top-p).
        # With replay the recorder applies the warpers (generate's own are off).
        self.generation_config = GenerationConfig(
            do_sample=True,
            temperature=1.0 if self.replay else s.temperature,
            top_p=1.0 if self.replay or s.top_p is None else s.top_p,
            top_k=0 if self.replay or s.top_k is None else s.top_k,
            min_p=None if self.replay else s.min_p,
            max_new_tokens=self.max_new_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_ids,
            return_dict_in_generate=True,
        )

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, want_logprobs: bool = False) -> list[Completion]:
        """`n` samples for each prompt, grouped: completions [i*n : (i+1)*n] belong to prompts[i]."""
        if not prompts:
            return []

        def sample_round(requests: list[Request]) -> list[Sampled]:
            return self._sample(requests, want_logprobs)

        if self.tools is not None:
            return sample_with_tools(prompts, n, self.tools, self.max_new_tokens, self.min_new_tokens,
                                     set(self.eos_ids), sample_round, want_logprobs)  # fmt: skip
        if self.thinking is not None:
            return sample_with_budget(prompts, n, self.thinking, self.max_new_tokens, self.min_new_tokens,
                                      set(self.eos_ids), sample_round, want_logprobs)  # fmt: skip
        rows = [p for p in prompts for _ in range(n)]
        out = sample_round([(p, self.max_new_tokens, self.min_new_tokens) for p in rows])
        return [Completion(p, ids, ids[-1] not in self.eos_ids, lp, kept=kept) for p, (ids, lp, kept) in zip(rows, out)]

    def _sample(self, requests: list[Request], want_logprobs: bool) -> list[Sampled]:
        """One batched `generate` over (context, most new tokens, fewest before an end token) requests."""
        device = next(self.model.parameters()).device
        width = max(len(c) for c, _, _ in requests)
        ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(requests), width), dtype=torch.long)
        for i, (c, _, _) in enumerate(requests):
            ids[i, width - len(c) :] = torch.tensor(c)
            attn[i, width - len(c) :] = 1
        limits, min_new = [r[1] for r in requests], [r[2] for r in requests]
        extra = {"max_new_tokens": max(limits)}
        stops = StoppingCriteriaList([_RowLimit(width, limits)] if min(limits) < max(limits) else [])
        closed = _CallClosed(width, self.tools, len(requests)) if self.tools is not None else None
        if closed is not None:  # a round with tools: each row's new tokens are its text since its last observation
            stops.append(closed)
        if stops:
            extra["stopping_criteria"] = stops
        processors = LogitsProcessorList([_EndSuppressed(width, min_new, self.eos_ids)] if max(min_new) > 0 else [])
        recorder = _KeptSetRecorder(self.sampler) if self.replay else None
        if recorder is not None:
            processors.append(recorder)
        if processors:
            extra["logits_processor"] = processors
        was_training, model_defaults = self.model.training, self.model.generation_config
        self.model.eval()
        self.model.generation_config = self.generation_config
        self.generation_config.output_scores = want_logprobs
        try:
            out = self.model.generate(input_ids=ids.to(device), attention_mask=attn.to(device), **extra)
        finally:
            self.model.generation_config = model_defaults
            self.model.train(was_training)
        new = out.sequences[:, width:].cpu()
        token_lp = None
        if want_logprobs:
            # `scores` are the processed (temperature / top-p) logits the sampler drew from
            scores = torch.stack(out.scores, dim=1).float().log_softmax(-1).cpu()
            token_lp = scores.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        result = []
        for i, limit in enumerate(limits):
            end = limit if closed is None or closed.closed_at[i] is None else min(limit, closed.closed_at[i])
            comp, _ = trim_completion(new[i, :end].tolist(), set(self.eos_ids))
            lp = token_lp[i, : len(comp)].tolist() if token_lp is not None else None
            result.append((comp, lp, None if recorder is None else recorder.sets(i, len(comp))))
        return result

    def sync_weights(self, model) -> None:
        """Nothing to do: this engine samples from the training model itself."""
