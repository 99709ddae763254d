"""The Hugging Face `generate` engine: samples with the training model itself (CPU, or GPU without vLLM)."""

import torch
from transformers import GenerationConfig

from .engine import Completion, end_token_ids


def trim_completion(ids: list[int], eos_ids: set[int]) -> tuple[list[int], bool]:
    """Cut generated ids after the first end token (generate pads finished rows). Returns (ids, truncated).

    A row without one ran the full `max_new_tokens` (generate stops early only when every row is done).
    """
    for i, t in enumerate(ids):
        if t in eos_ids:
            return ids[: i + 1], False
    return ids, True


class HFEngine:
    """Sampling with `model.generate` on the training model itself (CPU, or GPU without vLLM).

    Prompts are left-padded; the model computes positions from the attention mask, so a padded prompt
    samples exactly like an unpadded one.
    """

    def __init__(self, model, tokenizer, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, min_p: float = 0.0):  # fmt: skip
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        if min_p > 0 and top_p < 1:
            # transformers applies min-p after top-p, vLLM (whose order the loss follows) before it
            raise ValueError(f"the hf engine samples min_p={min_p} after top_p={top_p}, unlike vLLM and the loss: "
                             "use one of them, or the vllm engine")  # fmt: skip
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = end_token_ids(model, tokenizer)
        # Our own config, swapped in during generate: transformers fills "unset" fields of a passed config
        # from model.generation_config, so a model default (top_k, repetition_penalty, ...) would otherwise
        # change the sampling distribution away from the one the loss scores (softmax(logits / T), top-p).
        self.generation_config = GenerationConfig(
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p if min_p > 0 else None,
            max_new_tokens=max_new_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_ids,
            return_dict_in_generate=True,
        )

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, want_logprobs: bool = False) -> list[Completion]:
        """`n` samples for each prompt, grouped: completions [i*n : (i+1)*n] belong to prompts[i]."""
        if not prompts:
            return []
        device = next(self.model.parameters()).device
        rows = [p for p in prompts for _ in range(n)]
        width = max(len(p) for p in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        for i, p in enumerate(rows):
            ids[i, width - len(p) :] = torch.tensor(p)
            attn[i, width - len(p) :] = 1
        was_training, model_defaults = self.model.training, self.model.generation_config
        self.model.eval()
        self.model.generation_config = self.generation_config
        self.generation_config.output_scores = want_logprobs
        try:
            out = self.model.generate(input_ids=ids.to(device), attention_mask=attn.to(device))
        finally:
            self.model.generation_config = model_defaults
            self.model.train(was_training)
        new = out.sequences[:, width:].cpu()
        token_lp = None
        if want_logprobs:
            # `scores` are the processed (temperature / top-p) logits the sampler drew from
            scores = torch.stack(out.scores, dim=1).float().log_softmax(-1).cpu()
            token_lp = scores.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        result = []
        for i, p in enumerate(rows):
            comp, truncated = trim_completion(new[i].tolist(), set(self.eos_ids))
            lp = token_lp[i, : len(comp)].tolist() if token_lp is not None else None
            result.append(Completion(p, comp, truncated, lp))
        return result

    def sync_weights(self, model) -> None:
        """Nothing to do: this engine samples from the training model itself."""
