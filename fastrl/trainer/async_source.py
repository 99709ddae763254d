"""The asynchronous batch source (`--async-staleness K`): rollouts in a process of their own, updates here.

Per batch at policy version v (docs/math.md §10): `AsyncFeed.next_batch(v)` (rank 0) -> each rank's share ->
scored samples with the behaviour log-probs attached. The loop of `trainer.train` takes the batch's optimizer
steps; after each one the weights go to the rollout process as the next version (so K counts optimizer steps);
once the batch is done its prompts are marked trained in the ledger, which the checkpoint holds. Each step's
record adds its batch's staleness (at admission), dropped groups, queue depth, the busy / idle
timeline and the prompt ids of the batch. A resumed run re-queues what was in flight.

Devices: on the CPU the rollout process shares the machine and the weights go through shared memory. On CUDA it
runs on GPUs of its own (the `rollout_gpus` setting, `rollout/devices.py`): it sees only them, tensor parallel
over all of them; every trainer rank checks by UUID that its GPU is none of them; the weights go over vLLM's
`nccl` engine, rank 0 the sender. CUDA without rollout GPUs (`rollout/devices.weight_backend`): the
rollout process shares trainer rank 0's GPU and the weights go over vLLM's `ipc` engine (`rollout/ipc_weights.py`),
every rank taking part in each push (vLLM's engine gathers the handles over all ranks), rank 0 the sender.
"""

import contextlib
import dataclasses
import os
import socket
import time

import torch
import torch.distributed as dist

from .async_feed import AsyncFeed, dealt_prompt_ids, share_groups, timeline
from .batching import KeptSets
from .build import Run, build_model
from .config import TrainConfig
from .fsdp import is_sharded
from .prompt_ledger import PromptLedger
from .rollout import Completion, build_prompt
from .rollout.devices import DevicePlan, check_rank_uuids, plan_rollout, visible_devices_for_children, visible_gpu_ids
from .rollout.interface import end_token_ids
from .rollout.sampling import resolve_replay
from .rollout.thinking import thinking_budget_of
from .rollout.vllm_engine import engine_replay_blocker, kv_cache_bytes, model_runner_v2, vllm_dtype
from .stages import Batch, attach_logprobs, score_batch
from .tiny import built_in
from .tiny.export import model_dir


def worker_spec(config, model, tokenizer, model_path: str):
    """The rollout process's engine settings: the in-process vLLM engine's, from the same config fields."""
    from .rollout.async_worker import WorkerSpec

    max_model_len = config.max_prompt_length + config.max_completion_length
    dtype = vllm_dtype(config, model)
    recorder = not model_runner_v2()  # the rollout process runs its engine core in itself: the recorder's records too
    replay = resolve_replay(config, engine_replay_blocker(config, recorder, in_process=False))
    return WorkerSpec(
        model=model_path,
        dtype=dtype,
        max_model_len=max_model_len,
        seed=config.seed,
        **config.sampler.engine_kwargs(),  # temperature, top_k, top_p, min_p in vLLM's numbers (0 / 1.0 / 0.0: off)
        max_tokens=config.max_completion_length,
        min_tokens=config.min_completion_length,
        stop_ids=tuple(end_token_ids(model, tokenizer)),
        chunk_tokens=config.rollout_chunk_tokens,
        kv_cache_bytes=kv_cache_bytes(config, model, dtype, max_model_len),
        enforce_eager=config.vllm_enforce_eager,
        gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        replay=("recorder" if recorder else "mask") if replay else "off",
        thinking=thinking_budget_of(config, tokenizer),
    )


def on_devices(spec, plan: DevicePlan | None):
    """The worker spec on the plan's GPUs: tensor parallel over them, their memory share, weights over NCCL."""
    if plan is None:
        return spec
    return dataclasses.replace(spec, tensor_parallel_size=plan.tensor_parallel_size, backend=plan.weight_backend,
                               gpu_memory_utilization=plan.gpu_memory_utilization)  # fmt: skip


def nccl_link(plan: DevicePlan, visible: tuple[int, ...], rank: int) -> tuple[str, int]:
    """Every trainer rank's check that its GPU is none of the rollout process's (by UUID), then the weight
    transfer group's rendezvous (rank 0's address and a free port), the same on every rank."""
    mine = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    ranks = [mine]
    shared = [None]
    if rank == 0:
        gpus = [visible.index(int(g)) for g in plan.rollout_visible.split(",")]  # in this process's numbering
        rollout = [str(torch.cuda.get_device_properties(i).uuid) for i in gpus]
        with socket.socket() as s:
            s.bind(("", 0))
            shared = [(rollout, os.environ.get("MASTER_ADDR", "127.0.0.1"), s.getsockname()[1])]
    if dist.is_initialized():
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
        dist.broadcast_object_list(shared, src=0)
    rollout, address, port = shared[0]
    check_rank_uuids(ranks, rollout)
    return address, port


def completions_of(groups) -> list[Completion]:
    """The groups' completions, with their kept sets (received as NumPy arrays) and their inserted spans where the
    rollout process sent them."""
    out = []
    for g in groups:
        kept = g.kept or [None] * len(g.completion_ids)
        inserted = g.inserted or [()] * len(g.completion_ids)
        for ids, lps, cut, sets, spans in zip(g.completion_ids, g.logprobs, g.truncated, kept, inserted):
            sets = None if sets is None else KeptSets(torch.from_numpy(sets[0]), torch.from_numpy(sets[1]))
            out.append(Completion(list(g.prompt_ids), list(ids), cut, list(lps), tuple(spans), sets))
    return out


class AsyncSource:
    """Rank 0 owns the rollout process and its feed and deals the admitted groups; every rank trains its share."""

    def __init__(self, run: Run, config: TrainConfig, reward):
        from .rollout.async_client import AsyncRollout

        self.run, self.config, self.reward = run, config, reward
        self.K, self.lead = config.async_staleness, run.rank == 0
        state = run.async_state or {}
        self.ledger = PromptLedger.from_state(state) if state else PromptLedger(run.stream.position)
        self.rollout = self.push = self.export = self.feed = None
        sharded = is_sharded(run.model)
        device = next(run.model.parameters()).device.type
        cuda = device == "cuda"
        visible = visible_gpu_ids(os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count()) if cuda else ()
        plan = plan_rollout(getattr(config, "rollout_gpus", ""), device, visible,
                            int(os.environ.get("LOCAL_WORLD_SIZE", "1")), self.K)  # fmt: skip
        link = nccl_link(plan, visible, run.rank) if plan is not None else None
        self.colocated = cuda and plan is None  # the rollout process on rank 0's GPU, weights over vLLM's ipc engine
        if not (self.lead or sharded or self.colocated):
            return
        try:
            if not self.lead:  # a sharded model's full tensors (or ipc handles) are gathered by every rank: each pushes
                self.push = self._weight_push(None, run.model, plan, link)
                self.push.push(run.step)
                return
            # vLLM loads the tiny model from an export whose weights the first push replaces: a sharded model exports an
            # unsharded copy
            exported = build_model(config, torch.device("cpu"))[0] if sharded and built_in(config.model) else run.model
            path, self.export = model_dir(config.model, exported, run.tokenizer)
            spec = on_devices(worker_spec(config, run.model, run.tokenizer, path), plan)
            if self.colocated:
                spec = dataclasses.replace(spec, backend="ipc")
            gpus = visible_devices_for_children(plan.rollout_visible) if plan else contextlib.nullcontext()
            with gpus:  # the rollout process sees only its GPUs, set before vLLM starts there
                self.rollout = AsyncRollout(spec, startup_timeout_s=config.rollout_timeout_s,
                                            timeout_s=config.rollout_timeout_s).start()  # fmt: skip
            self.push = self._weight_push(self.rollout, run.model, plan, link)
            self.push.push(run.step)
            self.feed = AsyncFeed(self.rollout, self.ledger, self._prompt_of, config.group_size,
                                  config.prompts_per_step, self.K, config.seed)  # fmt: skip
        except BaseException:
            self.close()
            raise

    def _weight_push(self, rollout, model, plan: DevicePlan | None, link):
        """Shared memory on the CPU; on CUDA vLLM's `ipc` engine (colocated) or, with rollout GPUs, its `nccl` engine,
        built on every rank (rank 0 sends)."""
        from .rollout.weight_push import WeightPush

        if self.colocated:
            from .rollout.ipc_weights import IpcWeightPush

            return IpcWeightPush(rollout, model, vllm_dtype(self.config, model), rank=self.run.rank)
        if plan is None:
            return WeightPush(rollout, model, rank=self.run.rank)
        from .rollout.nccl_weights import NcclWeightPush

        return NcclWeightPush(rollout, model, vllm_dtype(self.config, model), rank=self.run.rank,
                              master_address=link[0], master_port=link[1],
                              world_size=1 + plan.tensor_parallel_size)  # fmt: skip

    def _prompt_of(self, pid: int) -> list[int]:
        c = self.config
        problem = self.run.stream.problem_at(pid)
        return build_prompt(self.run.tokenizer, problem.prompt, c.prompt_template, c.chat_template, c.max_prompt_length)

    def next_batch(self, version: int) -> Batch:
        t0 = time.time()
        groups, self.stats = self.feed.next_batch(version) if self.lead else (None, {})
        mine = share_groups(groups, self.run.sp.dp_size, self.run.sp.dp_rank)
        self.shares = dealt_prompt_ids(mine)
        problems = [self.run.stream.problem_at(g.prompt_id) for g in mine]
        comps = completions_of(mine)
        if self.K == 0 and self.config.loss.is_cap is None:  # the synchronous loop's samples exactly
            for c in comps:
                c.logprobs = None
        samples, rollout = score_batch(comps, problems, self.config, self.reward, self.run.tokenizer, self.run.sp)
        if self.K > 0:  # the ratio is clipped against the behaviour policy (docs/math.md §10)
            for s in samples:
                s.old_logprobs = s.rollout_logprobs
        attach_logprobs(self.run, samples, old=self.K == 0 and self.config.needs_old_logprobs)
        return Batch(samples, rollout, time.time() - t0, groups)

    def stepped(self, version: int) -> None:
        """The weights of `version` go to the rollout process: its next tokens are sampled as `version` (every rank
        of a sharded model takes part, rank 0 sends)."""
        if self.push is not None:
            self.push.push(version)

    def finished(self, batch: Batch) -> None:
        if self.lead:
            self.ledger.trained([g.prompt_id for g in batch.groups])

    def fields(self, batch: Batch, version: int, step_s: float) -> dict:
        """The step's async metrics, its batch's: staleness at admission (the version of the batch's first step;
        its later steps are epochs over it, as in the synchronous loop), drops, waits, the timeline of the step,
        the prompt ids (and each rank's)."""
        out = dict(self.stats)
        if self.stats:
            out.update(timeline(self.stats, step_s))
        out["trained_prompt_ids"] = [g.prompt_id for g in (batch.groups or [])]
        if self.shares is not None:
            out["rank_prompt_ids"] = self.shares
        return out

    def save_state(self) -> None:
        """The prompt ledger goes into the checkpoint; the stream resumes after the last prompt it issued."""
        self.run.async_state, self.run.stream.position = self.ledger.state_dict(), self.ledger.next_id

    def close(self) -> None:
        if self.rollout is not None:
            self.rollout.close()
        if self.export is not None:
            self.export.cleanup()
        self.rollout = self.export = None
