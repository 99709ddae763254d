"""A discrete-event model of one GRPO run: synchronous, or asynchronous with bounded staleness and partial rollouts.

Pure Python. It replays, step by step, what `fastrl train` does with the vLLM engine (docs/math.md §10):

- The engine is continuous batching: each engine step runs every admitted request (at most `max_seqs`, new
  prompts' prefill within `max_batched_tokens`) and costs `step_s + decode_s · (requests decoding) + prefill_s ·
  (prompt tokens prefilled)`; each request it runs gains one token (a prefill samples its first token too).
  Adding a request costs `request_s` of engine time. A request ends at its length, or (partial rollouts,
  `chunk` > 0) at `chunk` new tokens: then it is parked and resubmitted, its prompt + tokens so far prefilled
  again, once the weights change or when the engine would idle while the trainer waits (`rollout/async_worker`).
- Synchronous (`staleness=None`): per step all prompts_per_step · G requests are added at once, the trainer
  waits for the last, then scores (`score_s`), updates (`update_s + update_token_s · completion tokens`) and
  pushes the weights (`push_s`, the engine idle).
- Asynchronous (`staleness=K`): the trainer keeps (K + 1) · prompts_per_step prompts out, takes finished groups
  in completion order, admits a group whose oldest token is at most K versions behind (else drops it and
  samples its prompt again), and after prompts_per_step admitted groups scores, updates and pushes. The push
  is applied between two engine steps: it waits for the running step to end, and both sides are busy with it
  for `push_s`. Tokens sampled after it carry the new version.

A completion's length is a function of (prompt id, sample): `cap` for the prompts `tail_prompt` picks (the
forced tail), else a draw from `lengths` (measured ones) seeded by the prompt id and sample, so every mode
samples the same lengths for the same prompt. `calibrate` turns a synchronous run's probe into `Costs`.
"""

import math
import random
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Costs:
    """Seconds each piece of work takes (per the unit named)."""

    step_s: float  # one engine step, fixed part
    decode_s: float  # per request decoding one token in an engine step
    prefill_s: float  # per prompt token prefilled in an engine step
    request_s: float  # engine time per request added (input processing, output assembly)
    score_s: float  # trainer time per step besides the update (decoding, rewards, advantages)
    update_s: float  # one optimizer step, fixed part
    update_token_s: float  # per completion token trained
    push_s: float  # one weight push (trainer and engine both)
    max_seqs: int = 256  # the engine's max_num_seqs
    max_batched_tokens: int = 8192  # the engine's max_num_batched_tokens


@dataclass(frozen=True)
class Workload:
    prompts_per_step: int
    group_size: int
    prompt_len: int  # tokens per prompt
    cap: int  # max_completion_length
    lengths: tuple[int, ...]  # natural completion lengths (measured), drawn per (prompt, sample)
    tail_every: int = 8  # 1 in tail_every prompts (seeded) has every completion forced to `cap`; 0: none
    seed: int = 0

    def __post_init__(self):
        if self.prompts_per_step < 1 or self.group_size < 1 or self.cap < 1 or self.prompt_len < 1:
            raise ValueError(f"prompts_per_step, group_size, cap, prompt_len must be >= 1: {self}")
        if not self.lengths or min(self.lengths) < 1 or max(self.lengths) > self.cap:
            raise ValueError(f"lengths must be non-empty, each in [1, cap={self.cap}]: {self.lengths[:8]}...")

    def length(self, pid: int, k: int) -> int:
        if tail_prompt(pid, self.tail_every, self.seed):
            return self.cap
        return random.Random(f"{self.seed}:{pid}:{k}").choice(self.lengths)


def tail_prompt(pid: int, every: int, seed: int) -> bool:
    """Whether prompt `pid` belongs to the forced tail: a seeded 1 in `every` (0: never)."""
    return every > 0 and random.Random(f"tail:{seed}:{pid}").randrange(every) == 0


@dataclass
class Result:
    marks: list[float]  # the time each step's record is logged
    gen_busy: list[float]  # per step: engine-step seconds
    trainer_wait: list[float]  # per step: trainer seconds blocked on rollouts
    dropped: int = 0
    staleness: list[float] = field(default_factory=list)  # per step: mean token staleness

    def window(self, first: int = 1) -> dict:
        """Wall time from step `first`'s record to the last's, and each side's idle fraction over it."""
        wall = self.marks[-1] - self.marks[first - 1]
        gen = sum(self.gen_busy[first:]) / wall
        wait = sum(self.trainer_wait[first:]) / wall
        return {"wall_s": wall, "generation_idle": 1 - gen, "trainer_idle": wait, "dropped": self.dropped,
                "staleness_mean": sum(self.staleness) / len(self.staleness)}  # fmt: skip


@dataclass
class _Req:
    pid: int
    k: int
    target: int  # the completion's final length
    done: int = 0  # tokens sampled before this piece
    limit: int = 0  # tokens this piece may sample
    new: int = 0  # tokens sampled in this piece
    prefilled: bool = False


class _Engine:
    def __init__(self, costs: Costs, work: Workload, chunk: int):
        self.c, self.w, self.chunk = costs, work, chunk
        self.t, self.version, self.busy = 0.0, 0, 0.0
        self.waiting: deque[_Req] = deque()
        self.running: list[_Req] = []
        self.parked: list[tuple[_Req, int]] = []  # (request, version it stopped under)
        self.first: dict[tuple[int, int], int] = {}  # (pid, k) -> version of its first token
        self.vsum: dict[tuple[int, int], int] = {}  # (pid, k) -> sum of its tokens' versions
        self.left: dict[int, int] = {}  # pid -> samples not finished
        self.out: deque[tuple[float, int]] = deque()  # finished groups: (time, pid)
        self.added = 0

    def submit(self, pid: int) -> None:
        self.left[pid] = self.w.group_size
        for k in range(self.w.group_size):
            self.first.pop((pid, k), None)
            self.vsum[(pid, k)] = 0
            self._add(_Req(pid, k, self.w.length(pid, k)))

    def _add(self, r: _Req) -> None:
        left = r.target - r.done
        r.limit, r.new, r.prefilled = (min(left, self.chunk) if self.chunk > 0 else left), 0, False
        self.waiting.append(r)
        self.added += 1

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def resume(self, trainer_waiting: bool) -> None:
        idle = not self.has_work()
        keep = []
        for r, v in self.parked:
            if v < self.version or (idle and trainer_waiting):
                self._add(r)
            else:
                keep.append((r, v))
        self.parked = keep

    def step(self) -> None:
        """One engine step from `self.t` (requests added since the last one are charged first)."""
        c = self.c
        self.t += c.request_s * self.added
        self.added = 0
        budget = c.max_batched_tokens - len(self.running)
        prefill = 0
        while self.waiting and len(self.running) < c.max_seqs:
            need = self.w.prompt_len + self.waiting[0].done
            if prefill and need > budget - prefill:
                break
            prefill += need
            self.running.append(self.waiting.popleft())
        decoding = sum(r.prefilled for r in self.running)
        dt = c.step_s + c.decode_s * decoding + c.prefill_s * prefill
        self.t += dt
        self.busy += dt
        still = []
        for r in self.running:
            r.prefilled = True
            self.first.setdefault((r.pid, r.k), self.version)
            self.vsum[(r.pid, r.k)] += self.version
            r.new += 1
            if r.new < r.limit:
                still.append(r)
                continue
            r.done += r.new
            if r.done < r.target:
                self.parked.append((r, self.version))
                continue
            self.left[r.pid] -= 1
            if self.left[r.pid] == 0:
                self.out.append((self.t, r.pid))
        self.running = still

    def advance_to(self, t: float) -> None:
        """Run the engine steps that start before `t` (nothing waits on them); then it is idle or mid-step."""
        while True:
            self.resume(trainer_waiting=False)
            if not self.has_work() or self.t >= t:
                break
            self.step()
        self.t = max(self.t, t)

    def oldest(self, pid: int) -> int:
        return min(self.first[(pid, k)] for k in range(self.w.group_size))


def simulate(costs: Costs, work: Workload, steps: int, staleness: int | None = None, chunk: int = 0) -> Result:
    """The run's timeline: synchronous when `staleness` is None, else asynchronous with that K."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if staleness is not None and staleness < 0:
        raise ValueError(f"staleness must be None or >= 0, got {staleness}")
    if chunk < 0 or (chunk and staleness is None):
        raise ValueError(f"chunk must be >= 0 and needs a staleness, got chunk={chunk}, staleness={staleness}")
    eng = _Engine(costs, work, chunk)
    res = Result([], [], [])
    P, G = work.prompts_per_step, work.group_size
    next_pid, requeued, out = 0, deque(), 0  # out: prompts submitted and not yet taken by the trainer
    t = 0.0
    for v in range(steps):
        busy0 = eng.busy
        if staleness is None:
            eng.t = t
            for pid in range(next_pid, next_pid + P):
                eng.submit(pid)
            batch = list(range(next_pid, next_pid + P))
            next_pid += P
            while eng.has_work():
                eng.step()
            wait, t = eng.t - t, eng.t
            eng.out.clear()
        else:
            wait, batch, refill = 0.0, [], True
            while len(batch) < P:
                if refill:  # at the batch's start and after a drop: keep (K + 1) * P prompts out
                    eng.advance_to(t)
                    while out < (staleness + 1) * P:
                        if requeued:
                            pid = requeued.popleft()
                        else:
                            pid, next_pid = next_pid, next_pid + 1
                        eng.submit(pid)
                        out += 1
                    refill = False
                while not eng.out:
                    eng.resume(trainer_waiting=True)
                    if not eng.has_work():
                        raise RuntimeError(f"step {v}: the trainer waits with nothing in flight (model bug)")
                    eng.step()
                done, pid = eng.out.popleft()
                out -= 1
                wait, t = wait + max(done - t, 0.0), max(t, done)
                if v - eng.oldest(pid) <= staleness:
                    batch.append(pid)
                else:
                    res.dropped += 1
                    requeued.append(pid)
                    refill = True
        tokens = [work.length(pid, k) for pid in batch for k in range(G)]
        res.staleness.append(_staleness(eng, batch, v, G))
        t += costs.score_s + costs.update_s + costs.update_token_s * sum(tokens)
        if staleness is None:
            res.marks.append(t)  # the synchronous loop logs before its weight sync
            t += costs.push_s
            eng.t, eng.version = t, v + 1
        else:
            eng.advance_to(t)  # the push waits for the running engine step
            t = max(t, eng.t) + costs.push_s
            eng.t, eng.version = t, v + 1
            res.marks.append(t)
        res.gen_busy.append(eng.busy - busy0)
        res.trainer_wait.append(wait)
    return res


def _staleness(eng: _Engine, batch: list[int], v: int, G: int) -> float:
    """Mean staleness, in versions at trainer version `v`, of the batch's tokens."""
    keys = [(pid, k) for pid in batch for k in range(G)]
    count = sum(eng.w.length(pid, k) for pid, k in keys)
    return (v * count - sum(eng.vsum[key] for key in keys)) / max(count, 1)


def fit(rows: list[tuple[float, ...]], ys: list[float]) -> list[float]:
    """Least-squares coefficients of ys ~ rows (normal equations; a column with no spread gets 0)."""
    n = len(rows[0])
    keep = [j for j in range(n) if j == 0 or max(r[j] for r in rows) > min(r[j] for r in rows)]
    A = [[sum(r[i] * r[j] for r in rows) for j in keep] for i in keep]
    b = [sum(r[i] * y for r, y in zip(rows, ys)) for i in keep]
    m = len(keep)
    for i in range(m):  # Gauss-Jordan with partial pivoting
        p = max(range(i, m), key=lambda r: abs(A[r][i]))
        A[i], A[p], b[i], b[p] = A[p], A[i], b[p], b[i]
        if abs(A[i][i]) < 1e-300:
            raise ValueError("singular least-squares system")
        for r in range(m):
            if r != i:
                f = A[r][i] / A[i][i]
                A[r] = [a - f * x for a, x in zip(A[r], A[i])]
                b[r] -= f * b[i]
    coef = [0.0] * n
    for i, j in enumerate(keep):
        coef[j] = b[i] / A[i][i]
    return coef


def calibrate(engine_steps: list[tuple[float, int, int]], calls: list[dict], steps: list[dict], **limits) -> Costs:
    """`Costs` from a synchronous run's probe.

    engine_steps: (seconds, requests decoding, prompt tokens prefilled) of each engine step;
    calls: per rollout call {"generate_s", "engine_s", "requests"}; steps: per optimizer step {"update_s",
    "completion_tokens", "push_s", "other_s"} (other_s: the trainer's time besides generate, update and push).
    A negative fitted coefficient is not kept: the engine's slopes are clamped to 0 (the fixed part refitted); the
    update falls back to its mean (a negative slope) or to a line through the origin (a negative fixed part).
    """
    ys = [s for s, _, _ in engine_steps]
    a, c, p = fit([(1.0, d, f) for _, d, f in engine_steps], ys)
    if c < 0 or p < 0:
        c, p = max(c, 0.0), max(p, 0.0)
        a = sum(y - c * d - p * f for y, d, f in engine_steps) / len(ys)
    u0, u1 = fit([(1.0, s["completion_tokens"]) for s in steps], [s["update_s"] for s in steps])
    if u1 < 0:  # no growth with tokens seen: the mean
        u0, u1 = sum(s["update_s"] for s in steps) / len(steps), 0.0
    elif u0 < 0:  # superlinear in tokens: proportional to them (through the origin)
        tokens = [s["completion_tokens"] for s in steps]
        u0, u1 = 0.0, sum(s["update_s"] * n for s, n in zip(steps, tokens)) / sum(n * n for n in tokens)
    request_s = sum(x["generate_s"] - x["engine_s"] for x in calls) / sum(x["requests"] for x in calls)
    mean = lambda xs: math.fsum(xs) / len(xs)  # noqa: E731
    return Costs(step_s=a, decode_s=c, prefill_s=p, request_s=max(request_s, 0.0),
                 score_s=mean([s["other_s"] for s in steps]), update_s=u0, update_token_s=u1,
                 push_s=mean([s["push_s"] for s in steps]), **limits)  # fmt: skip


# verl's Qwen2.5-Math-7B DAPO run (docs/advance/fully_async.md, "Asynchronous Training on 7B Model"): 128 H20,
# max response 28K, 512 prompts x 16 per step; colocated synchronous step 356.30 s = generation 177.85 +
# old_log_prob 53.92 + update_actor 113.81 (+ 10.72 other); its fully async run on 64:64 GPUs (staleness 0.5,
# partial rollouts): 150.63 s per step, update_actor 113.16 s.
VERL_7B = {"cap": 28 * 1024, "prompts": 512, "group": 16, "gen_s": 177.85, "old_logprob_s": 53.92,
           "update_s": 113.81, "step_s": 356.30, "async_update_s": 113.16, "async_step_s": 150.63}  # fmt: skip


def gpu_projection(mean_tokens: float, steps: int = 12, block: int = 256, scale: int = 16, push_s: float = 1.0,
                   tail_every: int = 16, seed: int = 0) -> dict:  # fmt: skip
    """A PROJECTION of verl's 7B setup under fastrl's three modes (step seconds; not a measurement).

    Assumptions: decode is memory-bound, so an engine step costs the same whatever the batch up to the
    engine's concurrency (every completion of a step fits at once on 128 GPUs, half of them on 64); the
    synchronous step's generation is the longest completion's (the cap's) engine steps, which sets that cost;
    completion lengths: exponential with mean `mean_tokens`, capped, plus 1 in `tail_every` prompts at the cap;
    the asynchronous trainer (64 GPUs) takes verl's measured asynchronous update_actor, needs no old_log_prob
    (the behaviour log-probs are vLLM's) and a `push_s` weight push; the engine (64 GPUs) runs at the
    synchronous step cost with half the concurrency. Time runs in blocks of `block` decode steps, and prompts
    and concurrency are both divided by `scale` (the same per-step times, `scale`x fewer requests to simulate).
    """
    v = VERL_7B
    cap = v["cap"] // block
    rng = random.Random(seed)
    lengths = tuple(min(cap, max(1, round(rng.expovariate(block / mean_tokens)))) for _ in range(4096))
    P, G = v["prompts"] // scale, v["group"]
    work = Workload(P, G, prompt_len=1, cap=cap, lengths=lengths, tail_every=tail_every, seed=seed)
    other = v["step_s"] - v["gen_s"] - v["old_logprob_s"] - v["update_s"]
    step = v["gen_s"] / cap  # one block of decode steps, any batch up to the engine's concurrency
    sync = Costs(
        step_s=step,
        decode_s=0.0,
        prefill_s=0.0,
        request_s=0.0,
        score_s=other + v["old_logprob_s"],
        update_s=v["update_s"],
        update_token_s=0.0,
        push_s=0.0,
        max_seqs=P * G,
        max_batched_tokens=10**9,
    )
    split = Costs(**{**sync.__dict__, "score_s": other, "update_s": v["async_update_s"], "push_s": push_s,
                     "max_seqs": P * G // 2})  # fmt: skip
    out = {}
    for name, costs, K, chunk in (("sync, 128 GPUs colocated", sync, None, 0), ("async K=1, 64:64", split, 1, 0),
                                  ("async K=1 + partial rollouts, 64:64", split, 1, -(-cap // 2))):  # fmt: skip
        w = simulate(costs, work, steps, K, chunk).window()
        out[name] = {**w, "step_s": w["wall_s"] / (steps - 1)}
    return out


def main() -> None:
    print("GPU PROJECTION (not a measurement) of verl's Qwen2.5-Math-7B DAPO setup, 28K max response, 128 H20")
    print("| mean completion tokens | mode | projected s / step | speed-up vs sync | generation idle | trainer idle "
          "| dropped groups |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for mean in (2000, 4000, 8000):
        rows = gpu_projection(mean)
        base = next(iter(rows.values()))["step_s"]
        for name, r in rows.items():
            print(f"| {mean} | {name} | {r['step_s']:.1f} | {base / r['step_s']:.2f}x | {r['generation_idle']:.2f} | "
                  f"{r['trainer_idle']:.2f} | {r['dropped']} |")  # fmt: skip
    print(
        f"verl measured: sync {VERL_7B['step_s']} s, fully async (64:64, staleness 0.5, partial) "
        f"{VERL_7B['async_step_s']} s per step ({VERL_7B['step_s'] / VERL_7B['async_step_s']:.2f}x)"
    )


if __name__ == "__main__":
    main()
