"""The rollout process of asynchronous training: a vLLM engine of its own, fed prompts and weights by the trainer.

The process (started by `async_client.AsyncRollout`, spawn) owns one `vllm.LLM` and drives its `LLMEngine`
with `step()` itself, so everything the trainer sends is applied between two engine steps:

- ("generate", prompt_id, prompt_ids, n, seed, options): n requests of one prompt, each with its own
  `SamplingParams.seed` (`request_seed`); `options` may override the spec's max_tokens, min_tokens and
  chunk_tokens for this group. Log-probs are always on (the engine runs with processed log-probs: the
  sampled token's log-prob under the distribution it was drawn from, the behaviour log-prob).
- ("rpc", name, kwargs): vLLM's RL API on `LLM` (`init_weight_transfer_engine`, `start_weight_update`,
  `update_weights`, `finish_weight_update`, `update_weight_version`); between start and finish the engine is
  not stepped (its layers are being reloaded). `finish_weight_update(weight_version=v)` sets the version the
  engine stamps on the tokens it samples next (`CompletionOutput.weight_versions`).
- ("waiting",): the trainer is blocked until the next group arrives (see partial rollouts).
- ("stop",)

It answers on the output queue: ("started", pid), ("ready", info), ("group", RolloutGroup), ("rpc_done",
name, result), ("parked", prompt_id, sample, tokens so far), ("error", traceback). A heartbeat (a shared
double: `time.monotonic()`, system-wide on Linux) is written every loop pass, so the trainer can tell a hung
engine from a slow one.

Partial rollouts (`chunk_tokens = N > 0`): a request asks for at most N new tokens. A completion that used
them up without an end token is parked; it is resubmitted, prompt + the tokens so far as the new prompt, when
the engine's weights change, or when the engine would otherwise be idle while the trainer waits. The KV of
the old tokens is recomputed under the new weights (a new request; the prefix cache is off, see below); the
old tokens keep their behaviour log-probs and versions, and the pieces' version spans are stitched.
Without chunking a request that runs across a weight update keeps the KV it computed under the old weights.

Kept sets (`spec.replay`, docs/math.md §9): our recorder (a V1 logits processor, vLLM's CPU build) or vLLM's
sampling mask (Model Runner V2) gives each token the set its sampler kept; one record per piece, concatenated in
order, sent in the group as NumPy int32 arrays (ids, counts) per completion.

A thinking budget (`spec.thinking`, `thinking.py`): a request asks for at most the tokens left before the budget
could run out (counted over all pieces); where it ran out with the span open, the tokens past it are dropped, the
stop-thinking sentence and closing marker inserted (log-prob 0.0, an empty kept set each, the group's `inserted`),
and the completion goes on at once. Request k of a completion is seeded as the in-process engine's round k.

On GPUs of its own (`backend="nccl"`) the heartbeat keeps going during `update_weights`: a long receive is not a
hung engine.

The prefix cache is off: vLLM cannot reset it while requests run ("Failed to reset prefix cache because
some blocks are not freed yet"), so after an update a new request could reuse KV computed by old weights.
"""

import os
import queue
import time
import traceback
from dataclasses import dataclass, field

import numpy as np

from ..staleness import RolloutGroup, VersionSpan, head_spans, merge_spans, parse_spans, stitch
from .interface import InsertedSpan
from .process_setup import die_with_parent, pin_cpus
from .thinking import ThinkingBudget, insertion, round_limit


def request_seed(seed: int, prompt_id: int, sample: int, piece: int = 0) -> int:
    """The `SamplingParams.seed` of one request: a function of the run's seed, the prompt, the sample and piece."""
    x = (seed * 1_000_003 + prompt_id) * 4099 + sample
    return (x * 131 + piece) % (2**63 - 1)


def whole_prefills(max_model_len: int) -> dict:
    """`LLM(...)` keywords that keep every prompt's prefill in one engine step on vLLM's CPU build (none elsewhere).

    After a partial (chunked) prefill vLLM's V1 runner rewinds a seeded request's generator with `set_offset`,
    which CPU generators lack ("RuntimeError: CPU Generator does not use offset"): with seeded requests, a step
    whose prompts exceed the token budget (long prompts; partial rollouts' resubmitted pieces) would crash.
    vLLM makes the same change on CPU for MLA models.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {}
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(max_model_len, 4096)}


@dataclass(frozen=True)
class WorkerSpec:
    """Everything the rollout process needs to build its engine (picklable)."""

    model: str  # a path or hub id vLLM loads
    dtype: str
    max_model_len: int
    seed: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    max_tokens: int  # the completion length limit
    min_tokens: int
    stop_ids: tuple[int, ...]
    chunk_tokens: int = 0  # > 0: partial rollouts, at most this many tokens per request
    kv_cache_bytes: int | None = None
    enforce_eager: bool = True
    gpu_memory_utilization: float = 0.9
    backend: str = "fastrl_shm"  # the weight-transfer backend ("nccl" on GPUs)
    replay: str = "off"  # the kept sets: "off", "recorder" (our V1 logits processor), "mask" (Model Runner V2's)
    tensor_parallel_size: int = 1
    thinking: ThinkingBudget | None = None  # the thinking budget (`thinking.py`), None when off
    extra: dict = field(default_factory=dict)  # more `LLM(...)` keywords


@dataclass
class _Sample:
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    pieces: list[tuple[VersionSpan, ...]] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    done: bool = False
    truncated: bool = False
    parked_at: int | None = None  # the version under which it ran out of its chunk
    kept: list = field(default_factory=list)  # with replay: each piece's kept sets, (ids, counts) int32 arrays
    key: int | None = None  # the recorder's key of the piece being sampled
    inserted: tuple[InsertedSpan, ...] = ()  # the tokens inserted, not sampled (the thinking budget's)


@dataclass
class _Group:
    prompt_ids: list[int]
    seed: int
    samples: list[_Sample]
    max_tokens: int
    min_tokens: int
    chunk_tokens: int


class RolloutWorker:
    def __init__(self, spec: WorkerSpec, out, beat):
        from vllm import LLM, SamplingParams

        from . import shm_transfer

        shm_transfer.register()
        self.spec, self.out, self.beat, self._params = spec, out, beat, SamplingParams
        if spec.replay not in ("off", "recorder", "mask"):
            raise ValueError(f"WorkerSpec.replay must be 'off', 'recorder' or 'mask', got {spec.replay!r}")
        extra = {**whole_prefills(spec.max_model_len), **spec.extra}
        if spec.replay == "recorder":
            from .vllm_kept import KeptSetRecorder

            extra["logits_processors"] = [KeptSetRecorder]
        elif spec.replay == "mask":
            extra["return_sampling_mask"] = True
        if spec.kv_cache_bytes is not None:
            extra["kv_cache_memory_bytes"] = spec.kv_cache_bytes
        self.llm = LLM(model=spec.model, dtype=spec.dtype, max_model_len=spec.max_model_len, seed=spec.seed,
                       logprobs_mode="processed_logprobs", enforce_eager=spec.enforce_eager,
                       gpu_memory_utilization=spec.gpu_memory_utilization, enable_prefix_caching=False,
                       tensor_parallel_size=spec.tensor_parallel_size,
                       weight_transfer_config={"backend": spec.backend}, **extra)  # fmt: skip
        self.engine = self.llm.llm_engine
        self.version = 0
        self.llm.update_weight_version("0")  # otherwise the tokens read "default"
        self.groups: dict[int, _Group] = {}
        self.outbox: list[tuple] = []
        self.updating = self.trainer_waiting = self.stopping = False
        self.busy_s = 0.0  # time inside engine.step()

    def run(self, ctrl) -> None:
        while not self.stopping:
            self.beat.value = time.monotonic()
            idle = not self.engine.has_unfinished_requests()
            self._handle(ctrl, block=idle or self.updating)
            if self.updating or self.stopping:
                continue
            self._resume_parked()
            if self.engine.has_unfinished_requests():
                t = time.monotonic()
                outputs = self.engine.step()
                self.busy_s += time.monotonic() - t
                for o in outputs:
                    if o.finished:
                        self._finished(o)
            self._flush()

    def _handle(self, ctrl, block: bool) -> None:
        """Apply every waiting message; when `block`, wait up to 0.2 s for the first (the heartbeat keeps going)."""
        try:
            msg = ctrl.get(timeout=0.2) if block else ctrl.get_nowait()
        except queue.Empty:
            self._flush()
            return
        while True:
            self._apply(msg)
            if self.updating or self.stopping:  # an update's messages are taken one at a time, in order
                return
            try:
                msg = ctrl.get_nowait()
            except queue.Empty:
                return

    def _apply(self, msg) -> None:
        kind = msg[0]
        if kind == "generate":
            _, prompt_id, prompt_ids, n, seed, options = msg
            if prompt_id in self.groups:
                raise ValueError(f"prompt id {prompt_id} is already being sampled")
            limits = {k: options.get(k, getattr(self.spec, k)) for k in ("max_tokens", "min_tokens", "chunk_tokens")}
            self.groups[prompt_id] = _Group(list(prompt_ids), seed, [_Sample() for _ in range(n)], **limits)
            for k in range(n):
                self._submit(prompt_id, k)
        elif kind == "rpc":
            _, name, kwargs = msg
            if name not in _RPCS:
                raise ValueError(f"unknown rollout RPC {name!r}; expected one of {sorted(_RPCS)}")
            if name == "update_weights" and self.spec.backend == "nccl":
                from .nccl_weights import beating

                with beating(self.beat):  # a long receive must not look like a hung engine
                    result = self.llm.update_weights(**kwargs)
            else:
                result = getattr(self.llm, name)(**kwargs)
            if name == "start_weight_update":
                self.updating = True
            elif name in ("finish_weight_update", "update_weight_version"):
                self.updating = False
                version = kwargs.get("weight_version", kwargs.get("new_version"))
                if version is not None:
                    self.version, self.trainer_waiting = int(version), False
            self._send(("rpc_done", name, result))
        elif kind == "waiting":
            self.trainer_waiting = True
        elif kind == "stop":
            self.stopping = True
        else:
            raise ValueError(f"unknown rollout message {kind!r}")

    def _submit(self, prompt_id: int, k: int) -> None:
        g, s, spec = self.groups[prompt_id], self.groups[prompt_id].samples[k], self.spec
        left = g.max_tokens - len(s.ids)
        limit = min(left, g.chunk_tokens) if g.chunk_tokens > 0 else left
        if spec.thinking is not None:  # up to where the budget could run out, counted over every piece
            limit = min(limit, round_limit(g.prompt_ids, s.ids, s.inserted, spec.thinking, g.max_tokens))
        truncation, extra = {"top_k": spec.top_k, "top_p": spec.top_p}, {}
        if spec.replay == "recorder":  # top-k / top-p applied by the recorder, the request's own off
            from .vllm_kept import EXTRA_KEY, opt_in

            extra["extra_args"] = opt_in(spec.top_k, spec.top_p)
            s.key = extra["extra_args"][EXTRA_KEY]["key"]
            truncation = {"top_k": 0, "top_p": 1.0}
        params = self._params(
            n=1,
            temperature=spec.temperature,
            **truncation,
            min_p=spec.min_p,
            max_tokens=limit,
            min_tokens=min(max(g.min_tokens - len(s.ids), 0), limit),
            logprobs=0,
            stop_token_ids=list(spec.stop_ids),
            detokenize=False,
            seed=request_seed(g.seed, prompt_id, k, len(s.pieces)),
            **extra,
        )
        s.parked_at = None
        rid = f"{prompt_id}:{k}:{len(s.pieces)}"
        self.engine.add_request(rid, {"prompt_token_ids": g.prompt_ids + s.ids}, params)

    def _finished(self, output) -> None:
        prompt_id, k, _ = (int(x) for x in output.request_id.split(":"))
        g = self.groups[prompt_id]
        c, s = output.outputs[0], g.samples[k]
        ids = list(c.token_ids)
        if c.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"request {output.request_id} ended with finish_reason={c.finish_reason!r}")
        s.ids += ids
        s.logprobs += [d[t].logprob for d, t in zip(c.logprobs, ids)]
        s.pieces.append(parse_spans(c.weight_versions, len(ids), self.version))
        s.lengths.append(len(ids))
        if self.spec.replay != "off":
            s.kept.append(self._kept(c, s, len(ids)))
        ended = bool(ids) and ids[-1] in self.spec.stop_ids and c.finish_reason == "stop"
        cut = None
        if self.spec.thinking is not None:
            cut = insertion(g.prompt_ids, s.ids, s.inserted, ended, self.spec.thinking, g.max_tokens)
        if cut is not None:
            self._insert(s, *cut)
            ended = False
        if ended or len(s.ids) >= g.max_tokens:
            s.done, s.truncated = True, not ended
        elif g.chunk_tokens > 0 and len(ids) >= g.chunk_tokens:  # its chunk used up: parked
            s.parked_at = self.version
            self._send(("parked", prompt_id, k, len(s.ids)))
        else:  # stopped where its thinking budget could run out, or cut there: the next round at once
            self._submit(prompt_id, k)
        if all(x.done for x in g.samples):
            del self.groups[prompt_id]
            self._send(("group", self._group(prompt_id, g)))
            self.trainer_waiting = False  # the trainer's wait ends with this group

    def _insert(self, s: _Sample, at: int, insert: list[int]) -> None:
        """The thinking budget ran out at completion position `at` (within the last piece): the tokens sampled after
        it are dropped and `insert` goes there, log-prob 0.0, an empty kept set each, labelled with the version of the
        token before them (they were not sampled: a label of their own would only add staleness)."""
        keep = s.lengths[-1] - (len(s.ids) - at)
        if keep < 0:
            raise RuntimeError(f"the thinking budget ran out at token {at}, before the last piece's first token")
        spans = head_spans(s.pieces[-1], keep)
        last = [p[-1] for p in (*s.pieces[:-1], spans) if p]
        version = last[-1].version if last else self.version
        added = (VersionSpan(version, keep, keep + len(insert)),) if insert else ()
        s.pieces[-1], s.lengths[-1] = merge_spans(spans + added), keep + len(insert)
        s.ids, s.logprobs = s.ids[:at] + insert, s.logprobs[:at] + [0.0] * len(insert)
        if s.kept:
            ids, counts = s.kept[-1]
            counts = np.concatenate([counts[:keep], np.zeros(len(insert), dtype=np.int32)])
            s.kept[-1] = (ids[: int(counts.sum())], counts)
        s.inserted = (*s.inserted, InsertedSpan(at, at + len(insert), "thinking"))

    def _kept(self, c, s: _Sample, n: int) -> tuple:
        """One piece's kept sets as NumPy int32 arrays (ids, counts): the recorder's records, or vLLM's mask."""
        from .vllm_kept import from_sampling_mask, take

        sets = take(s.key, n) if self.spec.replay == "recorder" else from_sampling_mask(c.sampling_mask, n)
        return sets.ids.numpy(), sets.counts.numpy()

    def _resume_parked(self) -> None:
        idle = not self.engine.has_unfinished_requests()
        for prompt_id, g in list(self.groups.items()):
            for k, s in enumerate(g.samples):
                if s.parked_at is not None and (s.parked_at < self.version or (idle and self.trainer_waiting)):
                    self._submit(prompt_id, k)

    def _group(self, prompt_id: int, g: _Group) -> RolloutGroup:
        return RolloutGroup(
            prompt_id,
            g.prompt_ids,
            [s.ids for s in g.samples],
            [s.logprobs for s in g.samples],
            [stitch(s.pieces, s.lengths) for s in g.samples],
            [s.truncated for s in g.samples],
            {"pieces": [len(s.pieces) for s in g.samples], "engine_busy_s": self.busy_s},
            [_joined(s.kept) for s in g.samples] if self.spec.replay != "off" else None,
            [s.inserted for s in g.samples],
        )

    def _send(self, msg) -> None:
        self.outbox.append(msg)
        self._flush()

    def _flush(self) -> None:
        """Move answers to the bounded output queue while it has room; the rest waits for the next pass."""
        while self.outbox:
            try:
                self.out.put_nowait(self.outbox[0])
            except queue.Full:
                return
            self.outbox.pop(0)


def _joined(pieces: list[tuple]) -> tuple:
    """A completion's kept sets: its pieces' (ids, counts), concatenated in order."""
    return np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces])


_RPCS = {
    "init_weight_transfer_engine",
    "start_weight_update",
    "update_weights",
    "finish_weight_update",
    "update_weight_version",
    "shutdown_weight_transfer_engine",
    "get_weight_version",
}


def worker_main(spec: WorkerSpec, ctrl, out, beat, parent_pid: int) -> None:
    """The rollout process's entry point (a spawn target): arm the parent-death signal, build, serve."""
    die_with_parent(parent_pid)
    pin_cpus(os.environ.get("FASTRL_ROLLOUT_CPUS", ""))
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process: one child
    beat.value = time.monotonic()
    out.put(("started", os.getpid()))
    try:
        worker = RolloutWorker(spec, out, beat)
        out.put(("ready", {"pid": os.getpid(), "version": worker.version}))
        worker.run(ctrl)
    except BaseException:
        out.put(("error", traceback.format_exc()))
        raise SystemExit(1)
