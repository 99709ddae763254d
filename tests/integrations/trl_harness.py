"""A tiny TRL GRPO run built in memory (no downloads): a random Qwen2 causal LM, a word-level tokenizer,
fixed prompts and a deterministic reward, trained by a given trainer class from a fixed seed."""

import copy

import torch

WORDS = [f"w{i}" for i in range(61)]
PROMPTS = ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9", "w10", "w11 w12", "w13 w14 w15", "w16 w17", "w18 w19 w20 w21"]
# TrainingArguments fields whose logged values are wall-clock times, not results
TIMING_KEYS = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<unk>"] + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.padding_side = "left"
    return fast


def model(seed=0, vocab=64, hidden=32, tie=False):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=tie,
        pad_token_id=0, eos_token_id=1, bos_token_id=None,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).float()


def load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).float()


def reward(completions, **kwargs):
    """Deterministic: the fraction of even-numbered words, minus 0.01 per word."""
    out = []
    for text in completions:
        words = text.split()
        even = sum(1 for w in words if w.startswith("w") and w[1:].isdigit() and int(w[1:]) % 2 == 0)
        out.append(even / max(len(words), 1) - 0.01 * len(words))
    return out


def config(tmp_path, **overrides):
    from trl import GRPOConfig

    fields = dict(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, seed=7, max_steps=3, learning_rate=1e-2,
        per_device_train_batch_size=2, gradient_accumulation_steps=2, steps_per_generation=4, num_generations=4,
        max_completion_length=8, logging_steps=1, report_to="none", save_strategy="no", activation_checkpointing=False,
        dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    fields.update(overrides)
    return GRPOConfig(**fields)


def dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": PROMPTS})


def run(trainer_cls, args, base_model, *, wrap=None, params=None, **trainer_kwargs):
    """Train a copy of `base_model` (a model, or the path of a saved one) with `trainer_cls`, after `wrap`
    (a function of the built trainer) when given; return (log_history, {param name: tensor}), the parameters
    read by `params(trainer)` when given."""
    data = dataset()
    net = base_model if isinstance(base_model, str) else copy.deepcopy(base_model)
    trainer = trainer_cls(
        model=net, reward_funcs=reward, args=args, train_dataset=data, processing_class=tokenizer(), **trainer_kwargs
    )
    if wrap is not None:
        trainer = wrap(trainer)
    trainer.train()
    if params is not None:
        params = params(trainer)
    else:
        params = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    logs = [{k: v for k, v in entry.items() if k not in TIMING_KEYS} for entry in trainer.state.log_history]
    return logs, params
