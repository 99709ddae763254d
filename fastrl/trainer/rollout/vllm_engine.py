"""vLLM rollouts in the trainer's process, colocated with training (GPU) or beside it (vLLM's CPU build).

Cycle per rollout batch: `generate` -> `sleep` (where the platform has sleep mode: weights offloaded or
dropped, KV cache freed, the trainer gets the memory) -> updates -> `sync_weights` (wake the weights, load
the trainer's, wake the KV cache, reset the prefix cache) -> `generate` ... The trainer also syncs once
before the first batch: vLLM loads `config.model` from disk, the trainer's copy may be warmed up or resumed.

- Weight sync: vLLM's in-place reload (`collective_rpc("reload_weights", ...)`) runs each layer's own
  loader and then vLLM's post-load processing again, so it also serves layers whose kernels repack their
  weights after loading (the CPU build's oneDNN linears, quantized GPU layers), where calling
  `model.load_weights` on the engine's model fails or leaves stale packed copies.
- Log-probs: `logprobs_mode="processed_logprobs"`, the sampled token's log-prob under the distribution
  it was drawn from (after temperature and top-p): what the `is_cap` correction needs (docs/math.md §2).
- vLLM reseeds the global RNGs and fixes torch's thread count while it starts; the trainer's are restored.
- Lengths: `max_model_len` is max_prompt_length + max_completion_length (a thinking budget's inserted tokens
  count in the completion), and a `vllm_kv_cache_gib` that cannot hold one such sequence is refused up front,
  so a long completion is never cut short by the engine; `min_completion_length` is vLLM's `min_tokens`.
- A thinking budget (`thinking.py`) or tools (`tool_turns.py`) sample in rounds, one `generate` call per round, a
  request per completion.
- Kept sets (`--sampler-replay`, `vllm_kept.py`): where Model Runner V2 runs (a GPU) vLLM returns them
  (`return_sampling_mask`, top_k > 0); on the V1 runner (its CPU build) our logits processor applies top-k / top-p
  and records them, vLLM's own top-k / top-p off. Either way each completion is a request of its own.

Tested on vLLM's CPU build (tests/rollout_vllm). Only a GPU run exercises the sleep / wake-up calls.
"""

import contextlib
import os
import random

import torch

from ..fsdp import full_state_items, is_sharded
from ..tiny.export import model_dir
from ..validate import ConfigError
from .async_worker import request_seed, whole_prefills
from .interface import Completion
from .sampling import SamplingEngine, resolve_replay
from .thinking import Request, Sampled, sample_with_budget
from .tool_turns import sample_with_tools


def vllm_dtype(config, model) -> str:
    """The dtype vLLM serves in: `config.vllm_dtype`, where "auto" is bfloat16 for bf16 on a GPU, else float32."""
    if config.vllm_dtype != "auto":
        return config.vllm_dtype
    return "bfloat16" if config.bf16 and next(model.parameters()).is_cuda else "float32"


def kv_bytes_per_token(model, dtype: str) -> int:
    """KV-cache bytes one token takes in vLLM: keys and values of every layer's KV heads."""
    c = model.config
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * heads * head_dim * (4 if dtype == "float32" else 2)


def kv_cache_bytes(config, model, dtype: str, max_model_len: int) -> int | None:
    """`vllm_kv_cache_gib` in bytes (None: vLLM sizes it); ConfigError if one longest sequence would not fit."""
    if not config.vllm_kv_cache_gib:
        return None
    size, need = int(config.vllm_kv_cache_gib * 2**30), kv_bytes_per_token(model, dtype) * (max_model_len + 256)
    if size < need:  # vLLM would refuse to start; 256: room for its block rounding
        raise ConfigError(
            "vllm_kv_cache_gib", config.vllm_kv_cache_gib, f"holds {size // kv_bytes_per_token(model, dtype)} tokens; "
            f"one max_prompt_length + max_completion_length = {max_model_len}-token sequence needs >= "
            f"{need / 2**30:.3f} GiB",
        )  # fmt: skip
    return size


def model_runner_v2() -> bool:
    """Whether vLLM runs Model Runner V2 here: its own rule (VLLM_USE_V2_MODEL_RUNNER when set, else where Triton
    is, so not on its CPU build), less the features that turn it off, which this engine never asks for."""
    from vllm import envs
    from vllm.triton_utils import HAS_TRITON

    return bool(HAS_TRITON if envs.VLLM_USE_V2_MODEL_RUNNER is None else envs.VLLM_USE_V2_MODEL_RUNNER)


@contextlib.contextmanager
def _trainer_state_kept():
    """Leave Python's, NumPy's and torch's RNG states and torch's CPU threads as they were."""
    import numpy  # a vLLM requirement

    py_state, np_state = random.getstate(), numpy.random.get_state()
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        yield
    random.setstate(py_state)
    numpy.random.set_state(np_state)
    torch.set_num_threads = set_threads  # vLLM's CPU worker replaces it with a no-op
    torch.set_num_threads(threads)


def engine_replay_blocker(config, recorder: bool, in_process: bool) -> str | None:
    """Why vLLM cannot give the kept sets here (None: it can): the sampling mask (Model Runner V2) needs top-k; our
    recorder (`recorder`) keeps its records in the engine core's process, which must be this one when `in_process`
    (the rollout process of async training runs its engine core in itself)."""
    if not recorder:
        return None if config.sampler.top_k is not None else "vLLM's sampling mask needs top_k > 0"
    if in_process and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        return "vLLM's engine core runs in another process (VLLM_ENABLE_V1_MULTIPROCESSING is not 0)"
    return None


class VLLMEngine(SamplingEngine):
    def __init__(self, model, tokenizer, config):
        super().__init__(model, tokenizer, config)
        # The weights are handed to the engine's model by reference: it must live in this process.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM, SamplingParams
        from vllm.platforms import current_platform

        self._params = SamplingParams
        path, self._export = model_dir(config.model, model, tokenizer)  # the tiny model: exported, fast tokenizer
        self.sleep_level = config.vllm_sleep_level if current_platform.is_sleep_mode_available() else 0
        # kept sets: vLLM's sampling mask where Model Runner V2 runs (GPU), else our recorder (a logits processor)
        self.recorder = not model_runner_v2()
        self.replay = resolve_replay(config, engine_replay_blocker(config, self.recorder, in_process=True))
        # a prompt of max_prompt_length and a completion of max_completion_length (inserted tokens included)
        max_model_len = config.max_prompt_length + config.max_completion_length
        dtype = vllm_dtype(config, model)
        extra = whole_prefills(max_model_len)  # seeded requests on vLLM's CPU build
        kv_bytes = kv_cache_bytes(config, model, dtype, max_model_len)
        if kv_bytes is not None:
            extra["kv_cache_memory_bytes"] = kv_bytes
        if self.replay:
            from .vllm_kept import KeptSetRecorder

            extra.update({"logits_processors": [KeptSetRecorder]} if self.recorder else {"return_sampling_mask": True})
        with _trainer_state_kept():
            self.llm = LLM(
                model=path,
                dtype=dtype,
                enable_sleep_mode=self.sleep_level > 0,
                gpu_memory_utilization=config.vllm_gpu_memory_utilization,
                max_model_len=max_model_len,
                seed=config.seed,
                logprobs_mode="processed_logprobs",
                enforce_eager=config.vllm_enforce_eager,
                **extra,
            )
        self.asleep, self.seed = False, config.seed

    seeded = True  # generate takes prompt_ids: each request seeded through SamplingParams.seed
    # A bench hook (bench/async_step.py), None in training: prompt id -> (max_tokens, min_tokens) of its requests,
    # in place of the config's, as the rollout process's per-group `options` (a length mix both modes share).
    lengths_of = None

    def _lengths(self, prompt_id: int) -> tuple[int, int]:
        hi, lo = self.lengths_of(prompt_id)
        if not 0 <= lo <= hi <= self.max_new_tokens:
            raise ValueError(f"lengths_of({prompt_id}) = {(hi, lo)}: need 0 <= min <= max <= {self.max_new_tokens}")
        return hi, lo

    def generate(self, prompts: list[list[int]], n: int, want_logprobs: bool = False,
                 prompt_ids: list[int] | None = None) -> list[Completion]:  # fmt: skip
        """`n` samples for each prompt, grouped: completions [i*n : (i+1)*n] belong to prompts[i].

        `prompt_ids` (stream positions, one per prompt): sample k of prompt i is a request of its own seeded
        with `request_seed(seed, prompt_ids[i], k)`, the seed the asynchronous rollout process gives it too (under a
        thinking budget its r-th round's request `request_seed(seed, prompt_ids[i], k, r)`, the rollout process's
        piece r). Without them vLLM draws from its engine-wide generator.
        """
        if prompt_ids is not None and len(prompt_ids) != len(prompts):
            raise ValueError(f"{len(prompt_ids)} prompt_ids for {len(prompts)} prompts")
        if not prompts:
            return []
        if self.asleep:  # only when generate runs without a sync since the last batch
            self.llm.wake_up()
            self.asleep = False
        if self.thinking is not None or self.tools is not None:
            rounds = lambda requests, seeds=None: self._sample(requests, want_logprobs, seeds)  # noqa: E731
            seed_of = None
            if prompt_ids is not None:  # request k of a completion seeded as the rollout process seeds its piece k
                seed_of = lambda i, sample, k: request_seed(self.seed, prompt_ids[i], sample, k)  # noqa: E731
            by_rounds = sample_with_tools if self.tools is not None else sample_with_budget
            result = by_rounds(prompts, n, self.tools or self.thinking, self.max_new_tokens, self.min_new_tokens,
                               set(self.eos_ids), rounds, want_logprobs, seed_of)  # fmt: skip
        elif prompt_ids is not None or self.replay:  # a request per completion
            flat = [p for p in prompts for _ in range(n)]
            seeds = [None] * len(flat)
            limits = [(self.max_new_tokens, self.min_new_tokens)] * len(flat)
            if prompt_ids is not None:
                seeds = [request_seed(self.seed, pid, k) for pid in prompt_ids for k in range(n)]
                if self.lengths_of is not None:
                    limits = [self._lengths(pid) for pid in prompt_ids for _ in range(n)]
            params = [self._sampling(1, hi, lo, want_logprobs, s) for s, (hi, lo) in zip(seeds, limits)]
            outs = self._generate([{"prompt_token_ids": p} for p in flat], params)
            result = [self._completion(p, o.outputs[0], want_logprobs, prm) for p, o, prm in zip(flat, outs, params)]
        else:
            outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts],
                                     self._sampling(n, self.max_new_tokens, self.min_new_tokens, want_logprobs),
                                     use_tqdm=False)  # fmt: skip
            result = [self._completion(p, c, want_logprobs) for p, out in zip(prompts, outs) for c in out.outputs]
        if self.sleep_level:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True
        return result

    def _generate(self, prompts: list[dict], params: list):
        """`llm.generate` of one request per prompt; the recorder's records of a failed call are dropped."""
        try:
            return self.llm.generate(prompts, params, use_tqdm=False)
        except BaseException:
            if self.replay and self.recorder:
                from .vllm_kept import EXTRA_KEY, discard

                discard(p.extra_args[EXTRA_KEY]["key"] for p in params)
            raise

    def _completion(self, prompt: list[int], c, want_logprobs: bool, params=None) -> Completion:
        ids = list(c.token_ids)  # ends with the end token unless cut at max_tokens
        lp = [d[t].logprob for d, t in zip(c.logprobs, ids)] if want_logprobs else None
        return Completion(list(prompt), ids, c.finish_reason == "length", lp, kept=self._kept(c, params))

    def _kept(self, c, params):
        """The completion's kept sets (None without replay): the recorder's, or vLLM's sampling mask."""
        if not self.replay:
            return None
        from .vllm_kept import EXTRA_KEY, from_sampling_mask, take

        n = len(c.token_ids)
        return take(params.extra_args[EXTRA_KEY]["key"], n) if self.recorder else from_sampling_mask(c.sampling_mask, n)

    def _sampling(self, n: int, max_new: int, min_new: int, want_logprobs: bool, seed: int | None = None):
        recording = self.replay and self.recorder  # top-k / top-p applied by the recorder, theirs off
        extra = {}
        sampling = self.sampler.engine_kwargs()  # vLLM's numbers: top_k 0, top_p 1.0, min_p 0.0 where off
        if recording:
            from .vllm_kept import opt_in

            extra["extra_args"] = opt_in(sampling["top_k"], sampling["top_p"])
            sampling.update(top_k=0, top_p=1.0)
        return self._params(
            n=n,
            **sampling,
            max_tokens=max_new,
            min_tokens=min(min_new, max_new),  # end tokens suppressed before it (a forced length)
            logprobs=0 if want_logprobs else None,  # 0: only the sampled token's log-prob
            stop_token_ids=self.eos_ids,
            detokenize=False,  # the trainer decodes with its own tokenizer
            seed=seed,
            **extra,
        )

    def _sample(self, requests: list[Request], want_logprobs: bool, seeds: list[int] | None = None) -> list[Sampled]:
        """One batched call over (context, most new tokens, fewest before an end token) requests, each with its seed
        (None: vLLM's engine-wide generator)."""
        seeds = seeds or [None] * len(requests)
        params = [self._sampling(1, limit, lo, want_logprobs, seed) for (_, limit, lo), seed in zip(requests, seeds)]
        outs = self._generate([{"prompt_token_ids": c} for c, _, _ in requests], params)
        result = []
        for out, prm in zip(outs, params):
            done = self._completion([], out.outputs[0], want_logprobs, prm)
            result.append((done.completion_ids, done.logprobs, done.kept))
        return result

    def sync_weights(self, model) -> None:
        """Load `model`'s current weights into the engine; prompts cached under the old ones are dropped."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        # a sharded model streams its tensors, each gathered on its own: never the whole model at once
        weights = full_state_items(model) if is_sharded(model) else iter(model.state_dict().items())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()
