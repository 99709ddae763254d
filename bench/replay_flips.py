"""The trainer's log-probs against vLLM's on one rollout, θ-recompute against replay (docs/math.md §8, §9).

Runs in the vLLM venv (`.ci/vllm.sh` builds it), the tiny model (random init, seed 0), one dtype per run on both
sides (vLLM's weights and the trainer's):

    PYTHONPATH=$PWD ~/.cache/fastrl/venv-vllm-*/bin/python bench/replay_flips.py --dtype float32
    PYTHONPATH=$PWD ~/.cache/fastrl/venv-vllm-*/bin/python bench/replay_flips.py --dtype bfloat16

vLLM samples at top-p 0.9, top-k 50, T 0.7 and records each token's kept set (our logits processor on its CPU
build); its processed log-probs are those of the set. The trainer scores the same tokens twice: finding the set
again from its own logits (θ-recompute), and replaying vLLM's sets. A cutoff flip is a token whose θ set differs
from the set vLLM kept (a token crossed the boundary because the two sides' logits differ by a rounding).
"""

import argparse
import json
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import fastrl  # noqa: E402
from fastrl.trainer.batching import Sample, collate  # noqa: E402
from fastrl.trainer.build import build_model  # noqa: E402
from fastrl.trainer.config import make_config  # noqa: E402
from fastrl.trainer.rollout import make_engine  # noqa: E402
from fastrl.trainer.update import StepSettings, completion_hidden, head_params, sequence_logprobs  # noqa: E402


def flips(model, samples, config, pad_id: int) -> int:
    """Tokens whose θ set (from the trainer's logits, the loss's search) differs from the set vLLM kept."""
    mb = collate(samples, False, pad_id)
    with torch.no_grad():
        hidden = completion_hidden(model, mb, False)
        weight, bias = head_params(model, hidden.dtype)
    vocab = weight.shape[0]
    _, ids, lps = fastrl.token_logprobs(hidden, weight, mb["targets"], bias=bias, temperature=config.temperature,
                                        top_k=config.top_k, top_p=config.top_p, return_topk=vocab)  # fmt: skip
    theta = torch.zeros(*ids.shape[:2], vocab, dtype=torch.bool).scatter_(2, ids, lps.isfinite())
    vllm = torch.zeros_like(theta).view(-1, vocab)
    offsets = mb["kept_offsets"]
    rows = torch.repeat_interleave(torch.arange(offsets.numel() - 1), offsets.diff())
    vllm[rows, mb["kept_ids"].long()] = True
    live = mb["kept_offsets"].diff().view(theta.shape[:2]) > 0
    return int(((theta != vllm.view_as(theta)).any(-1) & live).sum())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    args = ap.parse_args()
    config = make_config("tiny", engine="vllm", vllm_kv_cache_gib=0.25, vllm_enforce_eager=True, warmup_sft_steps=0,
                         temperature=0.7, top_p=0.9, top_k=50, max_completion_length=32, bf16=False,
                         vllm_dtype=args.dtype, sampler_replay="on")  # fmt: skip
    torch.manual_seed(0)
    model, tokenizer = build_model(config, torch.device("cpu"))
    model.eval()
    engine = make_engine("vllm", model, tokenizer, config)
    engine.sync_weights(model)
    model.to(getattr(torch, args.dtype))
    questions = [f"{a}+{b}=" for a, b in zip(range(args.prompts), range(3, 99))]
    prompts = [tokenizer.encode(q, add_special_tokens=True) for q in questions]
    comps = engine.generate(prompts, args.n, want_logprobs=True)
    replayed = [Sample(c.prompt_ids, c.completion_ids, 0.0, kept=c.kept) for c in comps]
    plain = [Sample(c.prompt_ids, c.completion_ids, 0.0) for c in comps]
    vllm = torch.tensor([x for c in comps for x in c.logprobs])
    settings = StepSettings(config.loss, 1 << 20, False, tokenizer.pad_token_id, impl="torch", bf16=False)
    out = {"dtype": args.dtype, "tokens": int(vllm.numel()), "vocab": len(tokenizer), "top_p": 0.9, "top_k": 50,
           "temperature": 0.7}  # fmt: skip
    n_flips = flips(model, replayed, config, tokenizer.pad_token_id)
    for name, samples, flipped in (("theta_recompute", plain, n_flips), ("replay", replayed, 0)):
        lp = sequence_logprobs(model, samples, settings)
        gap = (torch.tensor([x for row in lp for x in row]) - vllm).abs()
        out[name] = {"mean_abs_gap": float(gap.mean()), "max_abs_gap": float(gap.max()), "cutoff_flips": flipped}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
