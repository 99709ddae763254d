"""The trainer's side of asynchronous rollouts: start the rollout process, feed it, read its groups, watch it.

`AsyncRollout` spawns `async_worker.worker_main` (the process dies with the trainer: a parent-death signal)
and talks to it over two queues: commands in, answers out (the output queue is bounded; the worker keeps
what does not fit and retries). It is also vLLM's `VLLMWeightSyncClient` (the four weight-sync calls, sent as
RPCs the worker applies between engine steps), so vLLM's trainer-side weight-transfer engines drive it:
`WeightPush` uses the shared-memory engine on CPU (`shm_transfer`), `NcclWeightPush` vLLM's `nccl` engine on
GPUs of the rollout process's own (`devices.py`).

Every wait has a bound. Start-up: `startup_timeout_s` (vLLM's CPU engine took 123 s to start on the test
machine). Afterwards: the worker's heartbeat must be younger than `timeout_s`, and its process alive; a dead
or hung worker raises `RolloutWorkerError` naming what happened (the exit code, or the heartbeat's age, and
the worker's last error), and the worker is killed.
"""

import multiprocessing
import os
import queue
import time

from ..staleness import RolloutGroup
from .async_worker import WorkerSpec, worker_main


class RolloutWorkerError(RuntimeError):
    """The rollout process died, hung, or failed a request."""


class AsyncRollout:
    def __init__(self, spec: WorkerSpec, startup_timeout_s: float = 600.0, timeout_s: float = 300.0,
                 max_queued_groups: int = 64):  # fmt: skip
        for name, value in (("startup_timeout_s", startup_timeout_s), ("timeout_s", timeout_s)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if max_queued_groups < 1:
            raise ValueError(f"max_queued_groups must be >= 1, got {max_queued_groups}")
        ctx = multiprocessing.get_context("spawn")
        self.spec, self.startup_timeout_s, self.timeout_s = spec, startup_timeout_s, timeout_s
        self.ctrl, self.out = ctx.Queue(), ctx.Queue(maxsize=max_queued_groups)
        self.beat = ctx.Value("d", time.monotonic(), lock=False)
        self.process = ctx.Process(target=worker_main, args=(spec, self.ctrl, self.out, self.beat, os.getpid()),
                                   name="fastrl-rollout", daemon=True)  # fmt: skip
        self.groups: list[RolloutGroup] = []  # answers read while waiting for something else
        self.in_flight: set[int] = set()
        self.pid: int | None = None
        self.parked: list[tuple[int, int, int]] = []  # (prompt id, sample, tokens so far) of each parked piece
        self.last_error = ""
        self.wait_s = 0.0  # time the trainer spent blocked in next_group

    def start(self, wait: bool = True) -> "AsyncRollout":
        self.process.start()
        if wait:
            self._expect("ready", self.startup_timeout_s, "start")
        return self

    def submit(self, prompt_id: int, prompt_ids: list[int], n: int, seed: int, **options) -> None:
        """Sample `n` completions of `prompt_ids`; they come back together as one `RolloutGroup`.

        `options`: max_tokens, min_tokens, chunk_tokens for this group in place of the spec's.
        """
        unknown = set(options) - {"max_tokens", "min_tokens", "chunk_tokens"}
        if unknown:
            raise TypeError(f"unknown rollout options {sorted(unknown)}")
        if prompt_id in self.in_flight:
            raise ValueError(f"prompt id {prompt_id} is already in flight")
        self._check_alive()
        self.ctrl.put(("generate", prompt_id, list(prompt_ids), n, seed, options))
        self.in_flight.add(prompt_id)

    def next_group(self) -> RolloutGroup:
        """The next finished group (in completion order); blocks, within the timeouts, until one comes."""
        if not self.groups:
            if not self.in_flight:
                raise RuntimeError("next_group() with no prompt in flight would wait forever")
            self.ctrl.put(("waiting",))
            t = time.monotonic()
            while not self.groups:
                self._read_one(self.timeout_s, "generate")
            self.wait_s += time.monotonic() - t
        group = self.groups.pop(0)
        self.in_flight.discard(group.prompt_id)
        return group

    def ready_groups(self) -> list[RolloutGroup]:
        """Every group that has already arrived (no wait)."""
        while True:
            try:
                self._take(self.out.get_nowait())
            except queue.Empty:
                break
        out, self.groups = self.groups, []
        self.in_flight.difference_update(g.prompt_id for g in out)
        return out

    def queue_depth(self) -> int:
        """Finished groups waiting for the trainer (read here or still in the output queue)."""
        try:
            return len(self.groups) + self.out.qsize()
        except NotImplementedError:  # macOS
            return len(self.groups)

    # vLLM's VLLMWeightSyncClient: the weight-sync calls, applied by the worker between engine steps
    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.call("init_weight_transfer_engine", request={"init_info": init_info})

    def start_weight_update(self) -> None:
        self.call("start_weight_update")

    def update_weights(self, update_info) -> None:
        self.call("update_weights", request={"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.call("finish_weight_update", weight_version=weight_version)

    def update_weight_version(self, new_version: str) -> None:
        self.call("update_weight_version", new_version=new_version)

    def call(self, name: str, **kwargs):
        """Run `LLM.<name>(**kwargs)` in the worker between engine steps; its result."""
        self._check_alive()
        self.ctrl.put(("rpc", name, kwargs))
        return self._expect("rpc_done", self.timeout_s, name)[2]

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the worker (killed if it does not exit within `timeout_s`)."""
        if self.process.pid is None:
            return
        if self.process.is_alive():
            try:
                self.ctrl.put(("stop",))
            except (OSError, ValueError):
                pass
            self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        for q in (self.ctrl, self.out):
            q.cancel_join_thread()
            q.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _expect(self, kind: str, timeout_s: float, doing: str):
        """Read answers (keeping groups) until one of `kind` arrives."""
        while True:
            msg = self._read_one(timeout_s, doing)
            if msg[0] == kind:
                return msg

    def _read_one(self, timeout_s: float, doing: str):
        """One answer; RolloutWorkerError when the worker dies, or its heartbeat is older than `timeout_s`."""
        while True:
            try:
                msg = self.out.get(timeout=0.5)
            except queue.Empty:
                self._check_alive()
                age = time.monotonic() - self.beat.value
                if age > timeout_s:
                    self.process.kill()
                    raise RolloutWorkerError(
                        f"rollout worker (pid {self.process.pid}) sent no heartbeat for {age:.0f} s while "
                        f"{doing!r} (timeout {timeout_s:.0f} s): hung; killed it"
                    ) from None
                continue
            self._take(msg)
            return msg

    def _take(self, msg) -> None:
        kind = msg[0]
        if kind == "group":
            self.groups.append(msg[1])
        elif kind == "parked":
            self.parked.append(msg[1:])
        elif kind == "started":
            self.pid = msg[1]
            self.beat.value = time.monotonic()
        elif kind == "error":
            self.last_error = msg[1]
            self.process.join(10)
            raise RolloutWorkerError(f"rollout worker failed:\n{msg[1]}")

    def _check_alive(self) -> None:
        if self.process.pid is not None and not self.process.is_alive():
            try:  # its last words, if it had time for them
                while True:
                    msg = self.out.get_nowait()
                    if msg[0] == "error":
                        self.last_error = msg[1]
            except (queue.Empty, OSError, ValueError):
                pass
            raise RolloutWorkerError(
                f"rollout worker (pid {self.process.pid}) exited with code {self.process.exitcode}"
                + (f"; its error:\n{self.last_error}" if self.last_error else "")
            )
