"""Vocab-parallel log-probs and loss on 2 and 4 gloo ranks equal the unsharded single-process call (docs/math.md §6).

Each rank holds `W.tensor_split(P)[rank]` (V = 1001 does not divide by 2 or 4) and the full hidden states
and targets; logp, entropy, the GRPO loss and every gradient (d_hidden on every rank, each rank's rows
of d_weight and d_bias) are compared in float32 with bias, temperature and ignored tokens, for both
implementations; a soft-cap with a per-token temperature (token_logprobs) and a soft-capped config (grpo_loss)
as well. The spawned ranks write their results; the comparison runs in the test process.
"""

import os

import pytest
import torch
import torch.distributed as dist
from _spawn import spawn

from fastrl import grpo_loss
from fastrl.kernels import token_logprobs
from fastrl.losses import LossConfig

IMPLS = ("torch", "triton")
# (name, N, D, V, bias, temperature, entropy)
CASES = (
    ("N77-D24-V1001-bias-t0.7-ent", 77, 24, 1001, True, 0.7, True),
    ("N33-D16-V1001-t1", 33, 16, 1001, False, 1.0, False),
    ("N9-D8-V3-bias-ent", 9, 8, 3, True, 1.3, True),  # V < 4: a rank of 4 owns no rows
)
CAP = 2.0  # soft-cap of the capped runs: logits of a few units, so the cap bends them
CAP_CASE = CASES[0]


def cap_tau(case):
    """The capped call's per-token temperature (the same on every rank)."""
    return torch.rand(case[1], generator=torch.Generator().manual_seed(7)) + 0.5


def inputs(case):
    _, n, d, v, has_bias, _, _ = case
    g = torch.Generator().manual_seed(n * 1000 + v)
    hidden = torch.randn(n, d, generator=g)
    weight = torch.randn(v, d, generator=g) * 0.5
    bias = torch.randn(v, generator=g) if has_bias else None
    targets = torch.randint(0, v, (n,), generator=g)
    targets[::5] = -100  # ignored tokens
    targets[0] = v - 1  # the last shard owns a target
    grad_logp, grad_entropy = torch.randn(n, generator=g), torch.randn(n, generator=g)
    return hidden, weight, bias, targets, grad_logp, grad_entropy


def run_logprobs(case, impl, hidden, weight, bias, targets, grad_logp, grad_entropy, group=None, softcap=None):
    """(logp, entropy, d_hidden, d_weight, d_bias) of one call; weight/bias may be this rank's rows. With a
    softcap, the per-token temperature of `cap_tau`."""
    _, _, _, _, _, temperature, entropy = case
    temperature = temperature if softcap is None else cap_tau(case)
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    b = None if bias is None else bias.clone().requires_grad_()
    out = token_logprobs(
        h,
        w,
        targets,
        bias=b,
        temperature=temperature,
        return_entropy=entropy,
        impl=impl,
        process_group=group,
        softcap=softcap,
    )
    logp, ent = out if entropy else (out, None)
    total = (logp * grad_logp).sum() + (0 if ent is None else (ent * grad_entropy).sum())
    total.backward()
    return logp.detach(), None if ent is None else ent.detach(), h.grad, w.grad, None if b is None else b.grad


def run_loss(impl, hidden, weight, bias, targets, group=None, softcap=None):
    """(loss, d_hidden, d_weight, d_bias) of grpo_loss with an entropy bonus on a [3, T] view of the tokens."""
    n = hidden.shape[0] // 3 * 3
    h = hidden[:n].clone().view(3, n // 3, -1).requires_grad_()
    w = weight.clone().requires_grad_()
    b = None if bias is None else bias.clone().requires_grad_()
    t = targets[:n].view(3, n // 3)
    mask = t != -100
    adv = torch.tensor([1.0, -0.5, 0.25])
    config = LossConfig(entropy_coef=0.01, temperature=0.9, softcap=softcap)
    out = grpo_loss(h, w, t, mask, adv, bias=b, config=config, impl=impl, process_group=group)
    out.loss.backward()
    return out.loss.detach(), h.grad, w.grad, None if b is None else b.grad


def _worker(rank, world, out_dir):
    group = dist.group.WORLD
    results = {}
    for impl in IMPLS:
        for case in CASES:
            hidden, weight, bias, targets, gl, ge = inputs(case)
            w_rows = weight.tensor_split(world)[rank]
            b_rows = None if bias is None else bias.tensor_split(world)[rank]
            results[impl, case[0], "logprobs"] = run_logprobs(
                case, impl, hidden, w_rows, b_rows, targets, gl, ge, group
            )
            results[impl, case[0], "loss"] = run_loss(impl, hidden, w_rows, b_rows, targets, group)
        hidden, weight, bias, targets, gl, ge = inputs(CAP_CASE)
        w_rows, b_rows = weight.tensor_split(world)[rank], bias.tensor_split(world)[rank]
        results[impl, "cap", "logprobs"] = run_logprobs(
            CAP_CASE, impl, hidden, w_rows, b_rows, targets, gl, ge, group, softcap=CAP
        )
        results[impl, "cap", "loss"] = run_loss(impl, hidden, w_rows, b_rows, targets, group, softcap=CAP)
    # a DTensor sharded on dim 0 (torch.chunk sizes, not tensor_split's) is accepted as well
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    case = CASES[0]
    hidden, weight, bias, targets, gl, ge = inputs(case)
    mesh = init_device_mesh("cpu", (world,))
    w_dt = distribute_tensor(weight, mesh, [Shard(0)]).requires_grad_()
    logp = token_logprobs(hidden, w_dt, targets, temperature=0.7, impl="torch", process_group=mesh.get_group())
    (logp * gl).sum().backward()
    results["dtensor"] = (logp.detach(), w_dt.grad.full_tensor())
    # bad input: clear errors, raised on every rank before any collective could be left half-done
    with pytest.raises(TypeError, match="ProcessGroup"):
        token_logprobs(hidden, weight, targets, process_group="world")
    with pytest.raises(TypeError, match="DTensor"):
        token_logprobs(hidden, w_dt.detach(), targets)
    with pytest.raises(ValueError, match="target 1001 is outside"):
        token_logprobs(hidden, weight.tensor_split(world)[rank], torch.full_like(targets, 1001), process_group=group)
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))


def _close(got, want, what):
    if want is None:
        assert got is None, what
        return
    torch.testing.assert_close(got, want, msg=lambda m: f"{what}: {m}")  # float32 default tolerances


def test_process_group_needs_torch_distributed():
    hidden, weight, _, targets, _, _ = inputs(CASES[1])
    with pytest.raises(ValueError, match="not initialized"):
        token_logprobs(hidden, weight, targets, process_group=object())


ROWS = [(c, c[0], None) for c in CASES] + [(CAP_CASE, "cap", CAP)]  # (case, key, softcap)


@pytest.fixture(scope="module")
def unsharded() -> dict:
    """The single-process results every world and rank is compared with, computed once."""
    want = {}
    for impl in IMPLS:
        for case, key, cap in ROWS:
            hidden, weight, bias, targets, gl, ge = inputs(case)
            want[impl, key, "logprobs"] = run_logprobs(case, impl, hidden, weight, bias, targets, gl, ge, softcap=cap)
            want[impl, key, "loss"] = run_loss(impl, hidden, weight, bias, targets, softcap=cap)
    hidden, weight, bias, targets, gl, ge = inputs(CASES[0])
    w = weight.clone().requires_grad_()
    logp = token_logprobs(hidden, w, targets, temperature=0.7, impl="torch")
    (logp * gl).sum().backward()
    want["dtensor"] = (logp.detach(), w.grad)
    return want


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 4])
def test_vocab_parallel_equals_unsharded(world, tmp_path, unsharded):
    spawn(_worker, world, tmp_path, str(tmp_path))
    for rank in range(world):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        for impl in IMPLS:
            for _, key, _ in ROWS:
                want = unsharded[impl, key, "logprobs"]
                have = got[impl, key, "logprobs"]
                tag = f"P{world} rank {rank} {impl} {key}"
                for name, a, b in zip(("logp", "entropy", "d_hidden"), have[:3], want[:3]):
                    _close(a, b, f"{tag} {name}")
                _close(have[3], want[3].tensor_split(world)[rank], f"{tag} d_weight rows")
                _close(have[4], None if want[4] is None else want[4].tensor_split(world)[rank], f"{tag} d_bias rows")
                loss, d_h, d_w, d_b = got[impl, key, "loss"]
                w_loss, w_h, w_w, w_b = unsharded[impl, key, "loss"]
                _close(loss, w_loss, f"{tag} loss")
                _close(d_h, w_h, f"{tag} loss d_hidden")
                _close(d_w, w_w.tensor_split(world)[rank], f"{tag} loss d_weight rows")
                _close(d_b, None if w_b is None else w_b.tensor_split(world)[rank], f"{tag} loss d_bias rows")
        logp, d_weight = unsharded["dtensor"]
        _close(got["dtensor"][0], logp, f"P{world} DTensor logp")
        _close(got["dtensor"][1], d_weight, f"P{world} DTensor d_weight")
