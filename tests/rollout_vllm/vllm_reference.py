"""Shared by the vLLM tests: the engine settings they run with and the transformers reference log-probs."""

import torch
from transformers import TemperatureLogitsWarper, TopPLogitsWarper

from fastrl.trainer.config import make_config

T = 0.7
TOL = 1e-4  # float32 vLLM against float32 transformers on the same tokens (seen: 1e-6 to 2e-5)
# a small KV cache and no torch.compile warm-up: the test machine is small and shared
ENGINE = dict(engine="vllm", vllm_kv_cache_gib=0.25, vllm_enforce_eager=True)


def tiny_config(**overrides):
    """The tiny preset on the vLLM engine, sampling at temperature T."""
    return make_config("tiny", **{**ENGINE, "temperature": T, **overrides})


def tiny_pair(**overrides):
    """(config, model, tokenizer): `tiny_config(**overrides)` and its model (seed 0, eval mode) and tokenizer."""
    from fastrl.trainer.build import build_model

    config = tiny_config(**overrides)
    torch.manual_seed(0)
    model, tokenizer = build_model(config, torch.device("cpu"))
    return config, model.eval(), tokenizer


@torch.no_grad()
def hf_logprobs(model, prompt: list[int], completion: list[int], temperature: float = T, top_p: float = 1.0):
    """Each completion token's log-prob under the sampling distribution, by transformers' own logits warpers."""
    ids = torch.tensor([prompt + completion])
    logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    scores = TemperatureLogitsWarper(temperature)(ids, logits)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(ids, scores)
    return scores.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def max_gap(model, completions, **sampling) -> float:
    """Largest |engine log-prob - transformers log-prob| over all tokens of `completions`."""
    was_training = model.training
    model.eval()
    try:
        return max(
            float(
                (hf_logprobs(model, c.prompt_ids, c.completion_ids, **sampling) - torch.tensor(c.logprobs)).abs().max()
            )
            for c in completions
        )
    finally:
        model.train(was_training)


def alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
