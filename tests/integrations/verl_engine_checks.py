"""fastrl's fused backend inside verl's real FSDP2 engine on 2 gloo ranks; runs in verl's environment:

    PYTHONPATH=<repo> <verl python> tests/integrations/verl_engine_checks.py OUT_DIR

verl's `FSDPEngineWithLMHead` (strategy fsdp2, fp32, remove-padding, 2 micro-batches per rank, so
gradient accumulation with FSDP2's deferred gradient sync) is built three times from the same random
Qwen2 checkpoint, tied and untied (`apply_fsdp2` then wraps the untied `lm_head` as its own FSDP unit):

- "verl":       use_fused_kernels=False, verl's logits path (the head called as a module): the reference;
- "fastrl":     use_fused_kernels=True with `external_lib=fastrl.integrations.verl`;
- "verl-fused": use_fused_kernels=True with verl's own torch backend (its outcome is printed, not judged).

Each runs the old/ref pass (`forward_only`, no grad) and a training pass whose loss weighs every token's
log-prob and entropy by random factors. Every rank writes its outputs, loss and full gradients; the parent
compares "fastrl" to "verl" at fp32 rel 1e-5 and exits non-zero at the first mismatch.

The engine asks verl's platform layer for the device; this file registers a CPU platform through verl's
own plugin API (`PlatformRegistry` / `set_platform`), the way an out-of-tree accelerator is added.

Two planted mutants of fastrl run on the untied head in the same launch, and each must be caught (raise or
differ): "planted" replaces fastrl's head call by a bare read of the head's weight (the bug this guards against),
"full_tensor" by a read all-gathered by hand outside FSDP's hooks.
"""

import contextlib
import datetime
import os
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from verl.plugin.platform import set_platform
from verl.plugin.platform.platform_cuda import PlatformCUDA

V, P_LEN = 151, (3, 5, 2, 4)


class CpuPlatform(PlatformCUDA):
    """verl's platform interface on CPU tensors and gloo."""

    device_name = "cpu"
    device_module = torch.cpu

    def is_available(self):
        return True

    def current_device(self):
        return "cpu"

    def device_count(self):
        return 1

    def set_device(self, device_index):
        pass

    def synchronize(self, device_index=None):
        pass

    def manual_seed(self, seed):
        torch.manual_seed(seed)

    def manual_seed_all(self, seed):
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings):
        pass

    def empty_cache(self):
        pass

    def communication_backend_name(self):
        return "gloo"


def save_models(root):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    paths = {}
    for tied in (True, False):
        torch.manual_seed(0)
        config = Qwen2Config(
            vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tied,
        )  # fmt: skip
        model = Qwen2ForCausalLM(config).float()
        # the initializer's tiny head gives near-uniform distributions: make them peaked, entropies ~0.2-4.
        # A tied head is also the embedding, which then dominates the residual stream; at std 0.5 the model
        # predicts its own input token (entropies down to 1e-8, where fp32 logits lose 3e-5 of the entropy)
        with torch.no_grad():
            model.lm_head.weight.normal_(0, 0.15 if tied else 0.5)
        paths[tied] = os.path.join(root, "tied" if tied else "untied")
        model.save_pretrained(paths[tied])
    return paths


def batch(seed):
    """4 sequences (lengths differ per seed), packed as verl's nested (jagged) tensors."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    g = torch.Generator().manual_seed(100 + seed)
    lengths = [7 + 3 * i + 2 * seed for i in range(4)]
    ids = [torch.randint(0, V, (n,), generator=g) for n in lengths]
    mask = [(torch.arange(n) >= P_LEN[i]).long() for i, n in enumerate(lengths)]

    def nested(ts):
        return torch.nested.as_nested_tensor(ts, layout=torch.jagged)

    data = TensorDict(
        {
            "input_ids": nested(ids),
            "position_ids": nested([torch.arange(n) for n in lengths]),
            "loss_mask": nested(mask),
            "w_logp": nested([torch.randn(n, generator=g) for n in lengths]),
            "w_ent": nested([torch.randn(n, generator=g) for n in lengths]),
        },
        batch_size=[4],
    )
    tu.assign_non_tensor(
        data, temperature=0.7, use_remove_padding=True, use_dynamic_bsz=False, micro_batch_size_per_gpu=2,
        calculate_entropy=True, return_model_output=True,
    )  # fmt: skip
    return data


def loss_fn(model_output, data, dp_group=None):
    """Σ (w_logp·logp + w_ent·entropy) over loss tokens / the global token count: both outputs get gradients."""
    from verl.utils import tensordict_utils as tu

    logp, ent = model_output["log_probs"].values(), model_output["entropy"].values()
    assert ent is not None and logp.shape == ent.shape == data["input_ids"].values().shape
    mask = data["loss_mask"].values().to(logp.dtype)
    total = tu.get_non_tensor_data(data=data, key="batch_num_tokens", default=None)
    loss = ((data["w_logp"].values() * logp + data["w_ent"].values() * ent.float()) * mask).sum() / total
    return loss, {}


def engine(path, fused, sp=1, attn="sdpa"):
    from verl.trainer.config.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine.fsdp import FSDPEngineWithLMHead

    model = HFModelConfig(
        path=path, load_tokenizer=False, use_remove_padding=True, use_fused_kernels=fused,
        fused_kernel_options={"impl_backend": "torch"}, enable_gradient_checkpointing=False,
        override_config={"attn_implementation": attn},
    )  # fmt: skip
    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    config = FSDPEngineConfig(
        strategy="fsdp2", mixed_precision=fp32, use_torch_compile=False, model_dtype="fp32",
        ulysses_sequence_parallel_size=sp,
    )  # fmt: skip
    eng = FSDPEngineWithLMHead(model, config, FSDPOptimizerConfig(lr=1e-3), CheckpointConfig())
    eng.initialize()
    return eng


def run_variant(path, variant, seed, sp=1, attn="sdpa", fused_forward=None):
    """Build verl's engine for `variant`, run the no-grad pass and the training pass on `batch(seed)`.

    fused_forward: the forward verl's `use_fused_kernels` installs (default: fastrl's; "verl-fused": verl's own).
    """
    import verl.models.transformers.dense_common as dense
    from transformers import Qwen2ForCausalLM

    import fastrl.integrations.verl as fv

    original = Qwen2ForCausalLM.forward
    if variant == "verl-fused":
        fused_forward = fv.VERL_FORWARDS["torch"]
    dense.forward_with_torch_backend = fused_forward or fv.forward_with_fastrl_backend
    try:
        eng = engine(path, fused=variant != "verl", sp=sp, attn=attn)
        seen, patched = [], Qwen2ForCausalLM.forward

        def checked(self, *args, **kwargs):  # the patched forward's contract, at every call the engine makes
            out = patched(self, *args, **kwargs)
            if variant != "verl":
                labels = kwargs["shift_labels"]
                seen.append((tuple(labels.shape), tuple(out.log_probs.shape), tuple(out.entropy.shape)))
            return out

        Qwen2ForCausalLM.forward = checked
        data = batch(seed)
        from verl.utils import tensordict_utils as tu

        tu.assign_non_tensor(data, use_fused_kernels=variant != "verl")
        with eng.eval_mode():  # the old/ref log-prob pass: no grad, the same backend
            old = eng.forward_backward_batch(data.clone(), loss_function=None, forward_only=True)["model_output"]
        with eng.train_mode():  # (which clears the gradients on exit)
            eng.optimizer_zero_grad()
            out = eng.forward_backward_batch(data, loss_function=loss_fn)
            grads = {n: p.grad.full_tensor() for n, p in eng.module.named_parameters()}
        head = eng.module.get_output_embeddings()
        return {
            "old_logp": old["log_probs"].values(), "old_entropy": old["entropy"].values(),
            "logp": out["model_output"]["log_probs"].values(), "entropy": out["model_output"]["entropy"].values(),
            "loss": torch.tensor(out["loss"]), "grads": grads,
            "head_is_unit": type(head).__name__.startswith("FSDP"), "seen": seen,
        }  # fmt: skip
    finally:
        Qwen2ForCausalLM.forward = original
        dense.forward_with_torch_backend = fv.forward_with_fastrl_backend


MUTANTS = ("planted", "full_tensor")


@contextlib.contextmanager
def mutant(kind):
    """fastrl's verl backend with a planted bug: "planted" reads the head's weight without calling the head's
    FSDP unit; "full_tensor" also all-gathers it by hand, outside FSDP's hooks; None: unchanged."""
    import fastrl.integrations.verl as fv

    head_unit, body_and_head = fv._head_unit, fv.lm_body_and_head
    if kind is not None:
        fv._head_unit = lambda model: None
    if kind == "full_tensor":

        def gathered(model):
            body, weight, bias = body_and_head(model)
            return body, weight.full_tensor() if hasattr(weight, "full_tensor") else weight, bias

        fv.lm_body_and_head = gathered
    try:
        yield
    finally:
        fv._head_unit, fv.lm_body_and_head = head_unit, body_and_head


def init_rank(rank, world, init_file):
    """This process as rank `rank` of a gloo group (every wait times out after 120 s) on the CPU platform."""
    set_platform(CpuPlatform())
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )  # fmt: skip
    torch.set_num_threads(1)


def worker(rank, world, init_file, paths, out_dir):
    init_rank(rank, world, init_file)
    run_cases(rank, paths, out_dir)
    leave()


def run_cases(rank, paths, out_dir):
    """Every variant on this rank, in the group `init_rank` joined; each writes `<out_dir>/<head>-<variant>-rankR`."""
    for tied, path in paths.items():
        # the mutants only on the untied head (its own FSDP unit); a tied head is read in the root unit
        for variant in ("verl", "fastrl", "verl-fused", *(() if tied else MUTANTS)):
            name = f"{'tied' if tied else 'untied'}-{variant}"
            try:
                with mutant(variant if variant in MUTANTS else None):
                    result = run_variant(path, "fastrl" if variant in MUTANTS else variant, rank)  # own data
            except Exception as e:  # the reference raises; the fused paths' failures are recorded
                if variant == "verl":
                    raise
                result = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
            torch.save(result, os.path.join(out_dir, f"{name}-rank{rank}.pt"))
            dist.barrier()


def leave():
    """All ranks meet, then leave without the interpreter's finalizers (a live gloo thread can abort them)."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def rel_diff(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1e-30))


def compare(out_dir):
    failures = []
    for kind in ("tied", "untied"):
        for rank in range(2):
            ref = torch.load(os.path.join(out_dir, f"{kind}-verl-rank{rank}.pt"), weights_only=False)
            got = torch.load(os.path.join(out_dir, f"{kind}-fastrl-rank{rank}.pt"), weights_only=False)
            own = torch.load(os.path.join(out_dir, f"{kind}-verl-fused-rank{rank}.pt"), weights_only=False)
            assert "error" not in ref, ref
            if "error" in got:
                failures.append(f"{kind} rank {rank}: fastrl backend raised {got['error']}\n{got['trace']}")
                continue
            assert ref["head_is_unit"] == (kind == "untied"), "verl did not wrap the untied head as its own unit"
            assert got["loss"].numel() == ref["loss"].numel() == 2  # two micro-batches: gradient accumulation
            diffs = {k: rel_diff(got[k], ref[k]) for k in ("old_logp", "old_entropy", "logp", "entropy", "loss")}
            diffs["grads"] = max(rel_diff(got["grads"][n], g) for n, g in ref["grads"].items())
            assert got["grads"].keys() == ref["grads"].keys()
            # every call: remove-padding labels (1, total_nnz); log-probs and entropy (never None) of that shape
            seen = got["seen"]
            assert len(seen) == 4 and all(s[0][0] == 1 and s[0] == s[1] == s[2] for s in seen), seen
            verdict = "ok" if max(diffs.values()) <= 1e-5 else "MISMATCH"
            line = " ".join(f"{k}={v:.1e}" for k, v in diffs.items())
            print(f"{verdict} {kind} rank {rank} fsdp2 engine fastrl vs verl logits path: max rel {line}")
            if verdict != "ok":
                failures.append(f"{kind} rank {rank}: {line}")
            if "error" in own:
                print(f"verl's own fused torch backend, {kind} rank {rank}: {own['error'][:300]}")
            else:
                d = max(rel_diff(own[k], ref[k]) for k in ("logp", "entropy", "loss"))
                print(f"verl's own fused torch backend, {kind} rank {rank}: ran, max rel diff {d:.1e}")
            for name in MUTANTS if kind == "untied" else ():
                bad = torch.load(os.path.join(out_dir, f"{kind}-{name}-rank{rank}.pt"), weights_only=False)
                if "error" in bad:
                    print(f"caught mutant {name} {kind} rank {rank}: raised {bad['error'][:200]}")
                    continue
                d = max(rel_diff(bad[k], ref[k]) for k in ("old_logp", "logp", "entropy", "loss"))
                d = max(d, max(rel_diff(bad["grads"][n], g) for n, g in ref["grads"].items()))
                if d > 1e-5:
                    print(f"caught mutant {name} {kind} rank {rank}: max rel diff {d:.1e}")
                else:
                    failures.append(f"mutant {name} {kind} rank {rank} not caught: max rel diff {d:.1e}")
    return failures


def main(out_dir):
    with tempfile.TemporaryDirectory() as tmp:
        paths = save_models(tmp)
        init_file = os.path.join(tmp, "rdv")
        mp.spawn(worker, args=(2, init_file, paths, out_dir), nprocs=2, join=True)
    failures = compare(out_dir)
    if failures:
        print("\n".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1])
