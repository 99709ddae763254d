"""vLLM rollouts colocated with training on one GPU (sleep while training, wake to generate).

Written against vLLM's documented Python API (`LLM(..., enable_sleep_mode=True)`, `LLM.sleep(level=1)`,
`LLM.wake_up(tags=[...])`, `SamplingParams(n=..., logprobs=0)`, `LLM.apply_model` / in-process model
access for weight loading). NOT EXERCISED in this repository's CI: vLLM does not install on the CPU
machines the tests run on. The HF engine in `hf_engine.py` implements the same interface and is tested.
The sampled-token log-probs are vLLM's defaults (raw model log-probs in older versions): they match the
trainer's only at temperature 1 and top_p 1, which the `is_cap` correction assumes.

Cycle per optimizer step: `generate` (engine awake) -> `sleep` (weights offloaded, KV cache freed, the
trainer gets the memory) -> update -> `sync_weights` (wake the weights only, load the new ones, then
wake the KV cache) -> `generate` ...
"""

import os

from ..fsdp import full_state_items, is_sharded
from .engine import Completion


class VLLMEngine:
    def __init__(self, config, tokenizer):
        # Weight loading reaches into the engine's model, which must live in this process.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM, SamplingParams

        self.tokenizer = tokenizer
        self.llm = LLM(
            model=config.model,
            enable_sleep_mode=True,
            gpu_memory_utilization=config.vllm_gpu_memory_utilization,
            max_model_len=config.max_prompt_length + config.max_completion_length,
            seed=config.seed,
            dtype="bfloat16",
        )
        self._params = SamplingParams
        self.max_new_tokens, self.temperature, self.top_p = (
            config.max_completion_length,
            config.temperature,
            config.top_p,
        )
        self.asleep = False

    def generate(self, prompts: list[list[int]], n: int, want_logprobs: bool = False) -> list[Completion]:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False
        params = self._params(
            n=n,
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_new_tokens,
            logprobs=0 if want_logprobs else None,  # 0: only the sampled token's log-prob
        )
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        result = []
        for prompt, out in zip(prompts, outs):
            for c in out.outputs:
                ids = list(c.token_ids)
                # with logprobs=0 each position's dict holds the sampled token's Logprob
                lp = [d[t].logprob for d, t in zip(c.logprobs, ids)] if want_logprobs else None
                result.append(Completion(list(prompt), ids, c.finish_reason == "length", lp))
        self.llm.sleep(level=1)
        self.asleep = True
        return result

    def sync_weights(self, model) -> None:
        """Push the trainer's weights into the sleeping engine (weights woken first, KV cache after)."""
        self.llm.wake_up(tags=["weights"])
        # a sharded model streams its tensors, each gathered on its own: never the whole model at once
        weights = full_state_items(model) if is_sharded(model) else list(model.state_dict().items())
        if hasattr(self.llm, "apply_model"):  # vLLM >= 0.9: run a function on the engine's model
            self.llm.apply_model(lambda m: m.load_weights(weights=weights))
        else:  # older in-process engines: reach the model through the driver worker
            worker = self.llm.llm_engine.model_executor.driver_worker
            runner = worker.worker.model_runner if hasattr(worker, "worker") else worker.model_runner
            runner.model.load_weights(weights=weights)
        self.llm.wake_up(tags=["kv_cache"])
        self.asleep = False
