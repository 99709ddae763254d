"""Evaluation during training: the `eval_*` options (`eval_options.py`) run inside the one loop of `trainer.train`.

When `eval_options.eval_due(step)` (every `eval_every` optimizer steps, after the last one, and at step 0 with
`eval_before_train`), every rank calls `Evaluator.evaluate(run, step)`:

  1. each rank takes its shard of every eval set's problems (problem i goes to rank i mod world);
  2. it samples `eval_samples` completions per problem from the current weights, with no gradient: greedy at one
     sample (the default), else at `eval_temperature` (default: the training one) with the training top-k / top-p /
     min-p; no thinking budget, no forced length;
  3. scores them with the training reward terms (`reward.score`; the length / overlong shaping is training's);
  4. rank 0 gathers the results, writes `<output_dir>/eval/step-N.jsonl` and returns the metrics
     (`eval_metrics.py`) that go on step N's row of metrics.jsonl; the other ranks return {}.

Engines: the synchronous vLLM source's engine samples the eval too (its weights synced first, one seeded request
per completion, put back to sleep at level 1 after, so its weights are there for a next batch without a sync, as
after the step-0 eval); otherwise (the HF engine, and `--async-staleness`, whose rollout process
never waits on an eval) an HF `generate` engine over the trainer's own model. The training stream is untouched:
Python's, NumPy's and torch's generators are saved before an eval and restored after it (an eval draws from a
generator seeded by the seed, the step and the rank), the prompt stream is not read, the optimizer not stepped.
"""

import contextlib
import random
import time
from dataclasses import dataclass

import torch

from fastrl.kernels.sampler import SamplerSettings
from fastrl.rewards import batch_accuracy_reward

from . import distributed as dist_utils
from .config import TrainConfig
from .eval_metrics import ProblemResult, eval_metrics, vote_key, write_eval_results
from .eval_options import EvalSet, eval_temperature, parse_eval_sets
from .eval_sets import held_out_arithmetic, trained_arithmetic, training_prompts
from .fsdp import is_sharded
from .rollout import Completion, HFEngine, build_prompt
from .tasks import Problem, load_problems
from .tool_options import tool_schemas
from .validate import ConfigError

__all__ = ["Evaluator", "load_eval_sets", "rng_kept"]

TOOL_FIELDS = ("tools", "tool_format", "max_tool_calls", "tool_timeout_s", "tool_memory_mb")

FRESH_DRAWS_SEED = 7_777_777  # added to the seed: `arithmetic:<N>` eval sets draw apart from the training list
FRESH_DRAWS = 256  # problems of an `arithmetic:<N>` eval set (eval_max_problems, when set, takes its first M)


def _held_out(config: TrainConfig, max_operand: int) -> list[Problem]:
    seen = training_prompts(config.dataset, config.seed)
    unseen = sum(f"{a}+{b}=" not in seen for a in range(max_operand + 1) for b in range(max_operand + 1))
    n = min(unseen, config.eval_max_problems) if config.eval_max_problems else unseen
    return held_out_arithmetic(config.dataset, config.seed, n, max_operand)


def _load(s: EvalSet, config: TrainConfig) -> list[Problem]:
    head, _, top = s.source.partition(":")
    if head == "arithmetic-heldout":
        return _held_out(config, int(top))
    if head == "arithmetic-trained":
        return trained_arithmetic(config.dataset, config.seed)
    if head == "arithmetic":
        return load_problems(s.source, config.seed + FRESH_DRAWS_SEED, n=FRESH_DRAWS)
    return load_problems(s.source, config.seed, split=config.eval_dataset_split, prompt_key=config.prompt_key,
                         answer_key=config.answer_key)  # fmt: skip


def load_eval_sets(config: TrainConfig) -> dict[str | None, list[Problem]]:
    """Each eval set's problems (the first `eval_max_problems` of each, when set), by name; ConfigError naming
    `eval_dataset` when one cannot be loaded. Empty without eval sets."""
    sets = {}
    for s in parse_eval_sets(config.eval_dataset):
        try:
            problems = _load(s, config)
        except (OSError, ValueError) as e:  # a missing file or column, an unknown HF dataset, no network
            raise ConfigError("eval_dataset", s.source, f"cannot be loaded: {str(e).splitlines()[0]}") from e
        sets[s.name] = problems[: config.eval_max_problems] if config.eval_max_problems else problems
    return sets


@contextlib.contextmanager
def rng_kept():
    """Leave Python's, NumPy's and torch's generators (CPU and the current CUDA device) as they were."""
    import numpy

    py_state, np_state = random.getstate(), numpy.random.get_state()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(py_state)
            numpy.random.set_state(np_state)


@dataclass(frozen=True)
class _EvalSampling:
    """What an engine reads of a config (`rollout.SamplingEngine`), for eval: no thinking budget, forced length or
    kept sets; the training run's tools (a model trained to call them is evaluated with them)."""

    sampler: SamplerSettings
    max_completion_length: int
    min_completion_length: int = 0
    thinking_budget: int = 0
    sampler_replay: str = "off"
    tools: str = ""
    tool_format: str = "code"
    max_tool_calls: int = 0
    tool_timeout_s: float = 10.0
    tool_memory_mb: int = 1024


def _eval_seed(seed: int, step: int, rank: int, index: int = 0, sample: int = 0) -> int:
    return ((((seed * 1_000_003 + step) * 8_191 + rank) * 131_071 + index) * 257 + sample) % (2**63 - 1)


class Evaluator:
    """Evaluates the policy on the eval sets; `evaluate(run, step)` on every rank (module docstring)."""

    def __init__(self, config: TrainConfig, reward, sets: dict[str | None, list[Problem]], run, engine=None):
        self.config, self.reward, self.sets = config, reward, sets
        self.k, self.temperature = config.eval_samples, eval_temperature(config)
        self.vllm = engine if getattr(engine, "llm", None) is not None else None  # the synchronous vLLM engine
        self.hf = None
        if self.vllm is None:
            greedy = self.temperature == 0
            c = config
            sampler = SamplerSettings() if greedy else SamplerSettings(self.temperature, c.top_k, c.top_p, c.min_p)
            tools = {name: getattr(c, name) for name in TOOL_FIELDS}
            self.hf = HFEngine(run.model, run.tokenizer, _EvalSampling(sampler, c.max_completion_length, **tools))
            self.hf.generation_config.do_sample = not greedy  # greedy: generate's argmax, no warper, no draw

    def evaluate(self, run, step: int) -> dict:
        """Every set's metrics on rank 0 ({} elsewhere) and `eval/step-<step>.jsonl` written there."""
        rank, world = dist_utils.rank(), dist_utils.world_size()
        metrics, results = {"eval_version": step}, {}
        with rng_kept():
            torch.manual_seed(_eval_seed(self.config.seed, step, rank))
            for name, problems in self.sets.items():
                t0 = time.time()
                mine = [(i, p) for i, p in enumerate(problems) if i % world == rank]
                # sharded weights: every rank runs as many generate calls as the others (each gathers the layers)
                fill = -(-len(problems) // world) - len(mine) if is_sharded(run.model) else 0
                gathered = _gather(self._results(run, step, mine + [(-1, problems[0])] * fill)[: len(mine)])
                if rank == 0:
                    results[name] = sorted(gathered, key=lambda r: int(r.problem_id))
                    metrics.update(eval_metrics(results[name], time.time() - t0, name))
        if rank != 0:
            return {}
        write_eval_results(self.config.output_dir, step, results)
        return metrics

    def _results(self, run, step: int, mine: list[tuple[int, Problem]]) -> list[ProblemResult]:
        c, k = self.config, self.k
        prompts = [build_prompt(run.tokenizer, p.prompt, c.prompt_template, c.chat_template, c.max_prompt_length,
                                tool_schemas(c)) for _, p in mine]  # fmt: skip
        if self.vllm is not None:
            comps = self._vllm(run, prompts, [_eval_seed(c.seed, step, 0, i, j) for i, _ in mine for j in range(k)])
        else:  # as many rows per generate call as a training batch's share of this rank
            per_call = max(1, c.prompts_per_step * c.group_size // (k * dist_utils.world_size()))
            calls = [prompts[s : s + per_call] for s in range(0, len(prompts), per_call)]
            comps = [x for part in calls for x in self.hf.generate(part, k)]
        texts = [run.tokenizer.decode(x.completion_ids, skip_special_tokens=True) for x in comps]
        golds = [p.answer for _, p in mine for _ in range(k)]
        scores = self.reward.score(texts, golds)
        correct = scores.per_fn["accuracy"] if "accuracy" in scores.per_fn else batch_accuracy_reward(texts, golds)
        out = []
        for j, (i, p) in enumerate(mine):
            sl = slice(j * k, (j + 1) * k)
            out.append(ProblemResult(
                str(i), p.prompt, p.answer, tuple(texts[sl]), tuple(float(r) for r in scores.total[sl]),
                tuple(float(x) > 0.5 for x in correct[sl]), tuple(len(x.completion_ids) for x in comps[sl]),
                tuple(x.truncated for x in comps[sl]), tuple(vote_key(t) for t in texts[sl]),
            ))  # fmt: skip
        return out

    def _vllm(self, run, prompts: list[list[int]], seeds: list[int]) -> list[Completion]:
        """One seeded request per completion on the synchronous source's vLLM engine, on the current weights."""
        from vllm import SamplingParams

        engine, k = self.vllm, self.k
        engine.sync_weights(run.model)  # mid-batch (several steps per batch) the engine still has the batch's
        c = self.config
        kw = {"temperature": 0.0} if self.temperature == 0 else (
            SamplerSettings(self.temperature, c.top_k, c.top_p, c.min_p).engine_kwargs())  # fmt: skip
        flat = [p for p in prompts for _ in range(k)]
        params = [SamplingParams(n=1, **kw, max_tokens=c.max_completion_length, stop_token_ids=engine.eos_ids,
                                 detokenize=False, seed=s) for s in seeds]  # fmt: skip
        outs = engine.llm.generate([{"prompt_token_ids": p} for p in flat], params, use_tqdm=False) if flat else []
        if engine.sleep_level:  # level 1 keeps the weights (in host memory): a generate may follow without a sync
            engine.llm.sleep(level=1)
            engine.asleep = True
        return [Completion(p, list(o.outputs[0].token_ids), o.outputs[0].finish_reason == "length")
                for p, o in zip(flat, outs)]  # fmt: skip


def _gather(results: list[ProblemResult]) -> list[ProblemResult]:
    """Every rank's results on rank 0 (the process group's timeout bounds the wait); [] on the other ranks."""
    if not dist_utils.is_distributed():
        return results
    import torch.distributed as dist

    everyone = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(results, everyone, dst=0)
    return [r for part in everyone for r in part] if everyone is not None else []
