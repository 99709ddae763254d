"""vLLM's `nccl` weight-transfer engine end to end on the CPU: trainer rank 0 sends (fastrl's `NcclWeightPush`),
the rollout process receives with vLLM's own engine code, a gloo group behind its seams (`nccl_seams`). Without
libnccl vLLM's communicator disables itself and its broadcast does nothing, so only the weights the engine serves
afterwards prove a transfer: they must equal the trainer's, cast to vLLM's dtype, bit for bit, after each of two
versions, each under its own label. The rollout process then dies in the middle of a third transfer: the
watchdog aborts the group and the push raises. One vLLM engine for the file (the last test).
"""

import socket
import tempfile
import threading
import time
import types

import nccl_seams
import pytest
import torch
from vllm_reference import tiny_pair

from fastrl.trainer.rollout import async_client
from fastrl.trainer.rollout.async_client import AsyncRollout
from fastrl.trainer.rollout.async_worker import WorkerSpec
from fastrl.trainer.rollout.nccl_weights import (
    CastSource,
    LabelledClient,
    NcclWeightPush,
    TransferAborted,
    Watchdog,
    beating,
    vllm_dtype,
)
from fastrl.trainer.tiny.export import save_tiny

DTYPE = "bfloat16"
# vLLM's fused parameters and the checkpoint tensors they stack (along dim 0)
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def test_cast_source_casts_one_tensor_at_a_time():
    model = torch.nn.Linear(3, 2)
    model.register_buffer("step", torch.tensor([7]))
    source = CastSource(model, torch.bfloat16)
    meta = {m.name: m for m in source.metadata()}
    assert meta["weight"].dtype == torch.bfloat16 and meta["step"].dtype == torch.int64
    pairs = iter(source)
    name, first = next(pairs)  # a generator: nothing else is cast yet
    assert name == "weight" and torch.equal(first, model.weight.detach().to(torch.bfloat16))
    assert dict(pairs)["step"].dtype == torch.int64


def test_vllm_dtype_refuses_a_non_float():
    assert vllm_dtype("float16") is torch.float16
    with pytest.raises(ValueError, match="'int8'"):
        vllm_dtype("int8")
    with pytest.raises(ValueError, match="'auto'"):
        vllm_dtype("auto")


def test_labelled_client_finishes_with_the_label():
    calls = []
    rollout = types.SimpleNamespace(
        start_weight_update=lambda: calls.append(("start",)),
        update_weights=lambda info: calls.append(("update", info)),
        finish_weight_update=lambda weight_version=None: calls.append(("finish", weight_version)),
    )
    client = LabelledClient(rollout)
    with pytest.raises(RuntimeError, match="version label"):
        client.start_weight_update()
    client.version = "3"
    client.start_weight_update()
    client.update_weights({"names": []})
    client.finish_weight_update()
    assert calls == [("start",), ("update", {"names": []}), ("finish", "3")]


def test_watchdog_aborts_once_when_the_process_dies():
    state, aborted = {"alive": True}, []
    with pytest.raises(TransferAborted, match="died during a weight transfer"):
        with Watchdog(lambda: state["alive"], lambda: aborted.append(time.monotonic()), period_s=0.02):
            state["alive"] = False
            deadline = time.monotonic() + 5
            while not aborted and time.monotonic() < deadline:  # the blocked broadcast, until the abort
                time.sleep(0.01)
    assert len(aborted) == 1


def test_watchdog_quiet_while_alive():
    aborted = []
    with Watchdog(lambda: True, lambda: aborted.append(1), period_s=0.01):
        time.sleep(0.1)
    assert not aborted


def test_beating_keeps_the_heartbeat_young_during_a_long_receive():
    beat = types.SimpleNamespace(value=time.monotonic() - 1000)
    ages = []
    with beating(beat, period_s=0.02):
        for _ in range(5):
            time.sleep(0.05)
            ages.append(time.monotonic() - beat.value)
    assert max(ages) < 1.0, ages


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _expected(state: dict, served_names) -> dict:
    """The checkpoint tensors, cast to vLLM's dtype, under vLLM's parameter names."""
    out = {}
    for name in served_names:
        stem, _, leaf = name.rpartition(".")
        parent, _, module = stem.rpartition(".")
        if name in state:
            out[name] = state[name]
        elif module in FUSED:
            out[name] = torch.cat([state[f"{parent}.{part}.{leaf}"] for part in FUSED[module]])
        else:
            raise KeyError(f"no checkpoint tensor for vLLM's {name}")
    return {k: v.to(vllm_dtype(DTYPE)) for k, v in out.items()}


def _step_weights(model, seed: int) -> dict:
    """A new policy version: every floating tensor moved by seeded noise; the trainer's state afterwards."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _die_during_a_transfer(monkeypatch, rollout, push) -> float:
    """Kill the rollout process while the sender waits in a broadcast that, like NCCL's, has no timeout of its own
    (it returns only when the group is aborted); the push must end with `TransferAborted`. Its duration."""
    group, released = push.engine.model_update_group, threading.Event()
    monkeypatch.setattr(group, "broadcast", lambda tensor, src, stream=None: released.wait(120))
    monkeypatch.setattr(group, "destroy", released.set)
    killer = threading.Timer(1.0, rollout.process.kill)
    killer.start()
    t = time.monotonic()
    with pytest.raises(TransferAborted, match="died during a weight transfer"):
        push.push(3)
    killer.join()
    return time.monotonic() - t


def test_served_weights_equal_the_trainers_after_two_versions(monkeypatch):
    from vllm.distributed.weight_transfer import nccl_engine

    nccl_seams.install(monkeypatch.setattr)
    monkeypatch.setattr(async_client, "worker_main", nccl_seams.worker_main)
    config, model, tokenizer = tiny_pair()
    export = tempfile.TemporaryDirectory(prefix="fastrl-tiny-")
    spec = WorkerSpec(
        model=save_tiny(model, tokenizer, export.name), dtype=DTYPE,
        max_model_len=config.max_prompt_length + config.max_completion_length, seed=config.seed,
        temperature=config.temperature, top_p=config.top_p, top_k=config.top_k, min_p=config.min_p,
        max_tokens=8, min_tokens=0, stop_ids=(tokenizer.eos_token_id,), kv_cache_bytes=int(0.25 * 2**30),
        backend="nccl",
    )  # fmt: skip
    with AsyncRollout(spec, startup_timeout_s=900, timeout_s=300) as rollout:
        rollout.start()
        push = NcclWeightPush(rollout, model, DTYPE, rank=0, master_address="127.0.0.1", master_port=_free_port(),
                              world_size=2)  # fmt: skip
        assert isinstance(push.engine.model_update_group, nccl_seams.GlooGroup)  # the engine's own code, our group
        assert push.engine.packed and isinstance(push.engine, nccl_engine.NCCLTrainerWeightTransferEngine)
        states = {}
        for version in (1, 2):
            states[version] = _step_weights(model, seed=version)
            push.push(version)
        served = rollout.call("served_log")
        rollout.submit(0, [1, 2, 3], n=2, seed=5)
        group = rollout.next_group()
        aborted_in = _die_during_a_transfer(monkeypatch, rollout, push)
        push.close()
    export.cleanup()
    assert [label for label, _ in served] == [1, 2], "each update must be served under its own label"
    for (label, weights), version in zip(served, (1, 2)):
        expected = _expected(states[version], weights)
        for name, tensor in weights.items():
            want = expected[name]
            rows = want.shape[0]  # vLLM pads the vocabulary rows of the embedding (with zeros)
            assert tensor.dtype == want.dtype and tensor.shape[1:] == want.shape[1:] and tensor.shape[0] >= rows, name
            assert torch.equal(tensor[:rows], want), f"version {version}: vLLM's {name} differs from the trainer's"
            assert not tensor[rows:].any(), f"version {version}: vLLM's {name} padding is not zero"
    assert any(group.completion_ids)
    for spans in group.spans:
        assert all(span.version == 2 for span in spans), spans
    assert aborted_in < 30, f"the transfer to a dead rollout process ended after {aborted_in:.0f} s"
