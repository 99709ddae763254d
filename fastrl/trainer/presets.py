"""The trainer's named presets (`--preset`) and reading a YAML / JSON config file: plain mappings of config fields,
which `config.make_config` lays over the dataclass defaults (defaults < preset < file < flags).
"""

import json

from .validate import ConfigError

__all__ = ["PRESETS", "read_config_file"]


# fmt: off
PRESETS = {
    # CPU, built-in model and task; learns visibly in a few minutes on 2 cores (docs/trainer.md).
    "tiny": dict(
        model="tiny", dataset="arithmetic:9", warmup_sft_steps=300,
        prompts_per_step=16, group_size=8, max_completion_length=12, rewards=("accuracy:1.0", "format:0.1"),
        lr=5e-4, max_steps=100, save_steps=25, max_tokens_per_microbatch=4096,
        num_threads=1, device="cpu", output_dir="runs/tiny", plot=True,
        vllm_kv_cache_gib=0.25,  # with --engine vllm: its CPU KV cache (the default share would be of host RAM)
    ),
    # CPU, the tiny model with the python tool: products of two 3-digit numbers, which it cannot compute but can
    # have the tool compute; the warm-up calls the tool in a quarter of its demonstrations (docs/trainer.md, "Tools").
    "tiny-tools": dict(
        model="tiny", dataset="products:3", tools="python", tiny_tokens=("```python\n", "```output\n", "```"),
        warmup_sft_steps=300, warmup_sft_noise=0.75,
        prompts_per_step=8, group_size=8, max_completion_length=48, rewards=("accuracy:1.0",),
        lr=2e-4, max_steps=100, save_steps=0, max_tokens_per_microbatch=4096,
        num_threads=1, device="cpu", output_dir="runs/tiny-tools", plot=True,
    ),
    # GPU: a reasoning model on competition math with 32k-token completions and vLLM rollouts
    # (DeepScaleR's setup). The R1-distilled chat template opens the <think> block in the prompt, so the
    # completions never contain "<think>" and the format reward would be a constant: accuracy only.
    "math-32k": dict(
        model="deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
        dataset="agentica-org/DeepScaleR-Preview-Dataset",
        prompt_key="problem",
        answer_key="answer",
        prompt_template="{prompt}\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
        chat_template=True,
        engine="auto", prompts_per_step=32, group_size=8, max_prompt_length=1024, max_completion_length=32768,
        rewards=("accuracy:1.0",), overlong_buffer=4096,
        loss_agg="token-mean", eps_high=0.28,
        max_tokens_per_microbatch=65536, gradient_checkpointing=True,
        lr=1e-6, lr_warmup_steps=10, max_grad_norm=1.0, max_steps=500, save_steps=25,
        output_dir="runs/math-32k",
    ),
}
# fmt: on


def read_config_file(file: str) -> dict:
    """The mapping of config fields in a YAML or JSON file; ConfigError naming the file otherwise."""
    try:
        with open(file, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError("config", file, f"cannot be read: {e.strerror or e}") from None
    try:
        if file.endswith((".yaml", ".yml")):
            import yaml

            loaded = yaml.safe_load(text)
        else:
            loaded = json.loads(text)
    except Exception as e:  # yaml.YAMLError / json.JSONDecodeError: say where, in one line
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError("config", file, f"is not valid {'YAML' if file.endswith(('yaml', 'yml')) else 'JSON'}"
                          f"{at}: {problem}") from None  # fmt: skip
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError("config", file, f"must hold a mapping of config fields, got a {type(loaded).__name__}")
    return {str(k).replace("-", "_"): v for k, v in loaded.items()}
