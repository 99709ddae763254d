"""The trainer's log-probs against vLLM's on the same rollout: mean and max |vLLM − trainer| per token.

Runs in the vLLM venv (`.ci/vllm.sh` builds it), float32, the tiny model:

    PYTHONPATH=$PWD ~/.cache/fastrl/venv-vllm-*/bin/python bench/vllm_sampler_gap.py [--top-p 0.9] [--top-k 50]

vLLM samples with its processed log-probs (`logprobs_mode="processed_logprobs"`: after temperature, min-p,
top-k, top-p). The trainer scores the same tokens twice: with the full softmax (what it did before the loss
learned the sampler's truncation) and with the truncation (docs/math.md §8).
"""

import argparse
import json
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from fastrl.losses import LossConfig  # noqa: E402
from fastrl.trainer.batching import Sample  # noqa: E402
from fastrl.trainer.build import build_model  # noqa: E402
from fastrl.trainer.config import make_config  # noqa: E402
from fastrl.trainer.rollout import make_engine  # noqa: E402
from fastrl.trainer.update import StepSettings, sampler_options, sequence_logprobs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--min-p", type=float, default=0.0)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    args = ap.parse_args()
    config = make_config("tiny", engine="vllm", vllm_kv_cache_gib=0.25, vllm_enforce_eager=True, warmup_sft_steps=0,
                         temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                         max_completion_length=32, bf16=False)  # fmt: skip
    torch.manual_seed(0)
    model, tokenizer = build_model(config, torch.device("cpu"))
    model.eval()
    engine = make_engine("vllm", model, tokenizer, config)
    engine.sync_weights(model)
    questions = [f"{a}+{b}=" for a, b in zip(range(args.prompts), range(3, 99))]
    prompts = [tokenizer.encode(q, add_special_tokens=True) for q in questions]
    comps = engine.generate(prompts, args.n, want_logprobs=True)
    samples = [Sample(c.prompt_ids, c.completion_ids, 0.0) for c in comps]
    vllm = torch.tensor([x for c in comps for x in c.logprobs])
    out = {"top_p": args.top_p, "top_k": args.top_k, "min_p": args.min_p, "temperature": args.temperature,
           "tokens": int(vllm.numel())}  # fmt: skip
    for name, sampler in (("full_softmax", None), ("sampler_truncated", sampler_options(config.loss))):
        loss = LossConfig(temperature=config.temperature, **(sampler or {}))
        lp = sequence_logprobs(model, samples, StepSettings(loss, 1 << 20, False, tokenizer.pad_token_id, impl="torch",
                                                            bf16=False))  # fmt: skip
        gap = (torch.tensor([x for row in lp for x in row]) - vllm).abs()
        out[name] = {"mean_abs_gap": float(gap.mean()), "max_abs_gap": float(gap.max())}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
