"""The public API's signatures, pinned: parameter names, order and defaults, read from the source with `ast`, so that a
user's code keeps working; a deliberate change edits this table and says so in the docs."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "fastrl"


# --- the public signatures: parameter names, order and defaults (source text), read from the source ---
def _signature(path: str, qualname: str) -> tuple:
    """(name, default source or None) per parameter, "*" / "*args" / "**kwargs" marking the kinds; for a class
    whose qualname names no method (a dataclass), its fields."""
    body = ast.parse((ROOT / path).read_text(encoding="utf-8")).body
    node = None
    for part in qualname.split("."):
        node = next(n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part)
        body = node.body
    if isinstance(node, ast.ClassDef):
        return tuple(
            (n.target.id, None if n.value is None else ast.unparse(n.value))
            for n in node.body
            if isinstance(n, ast.AnnAssign)
        )
    a = node.args
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    out = [(p.arg, d) for p, d in zip(positional, defaults)]
    if a.vararg:
        out.append(("*" + a.vararg.arg, None))
    elif a.kwonlyargs:
        out.append(("*", None))
    out += [(p.arg, None if d is None else ast.unparse(d)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append(("**" + a.kwarg.arg, None))
    return tuple(out)


_N = None  # no default
PUBLIC_SIGNATURES = {
    ("kernels/logprobs/api.py", "token_logprobs"): (
        ("hidden", _N), ("weight", _N), ("targets", _N), ("*", _N), ("bias", "None"), ("temperature", "1.0"),
        ("ignore_index", "-100"), ("return_entropy", "False"), ("impl", "'auto'"), ("process_group", "None"),
        ("top_k", "None"), ("top_p", "None"), ("min_p", "None"), ("softcap", "None"), ("return_topk", "None"),
        ("kept_ids", "None"), ("kept_offsets", "None"), ("batch_invariant", "False"),
    ),
    ("kernels/logprobs/api.py", "sampled_token_logprobs"): (
        ("hidden", _N), ("weight", _N), ("targets", _N), ("*", _N), ("bias", "None"), ("temperature", "1.0"),
        ("ignore_index", "-100"), ("return_entropy", "False"), ("impl", "'auto'"), ("top_k", "None"),
        ("top_p", "None"), ("min_p", "None"), ("softcap", "None"), ("return_topk", "None"), ("kept_ids", "None"),
        ("kept_offsets", "None"), ("batch_invariant", "False"),
    ),
    ("kernels/logprobs/kept_set.py", "kept_set_from_vllm"): (("sampling_masks", _N), ("completion_mask", _N)),
    ("losses/grpo.py", "grpo_loss"): (
        ("hidden", _N), ("weight", _N), ("targets", _N), ("mask", _N), ("advantages", _N), ("*", _N),
        ("bias", "None"), ("old_logprobs", "None"), ("ref_logprobs", "None"), ("rollout_logprobs", "None"),
        ("config", "None"), ("normalizer", "None"), ("impl", "'auto'"), ("process_group", "None"),
        ("temperature", "None"), ("return_entropy", "False"), ("top_k", "None"), ("top_p", "None"),
        ("min_p", "None"), ("kept_ids", "None"), ("kept_offsets", "None"), ("batch_invariant", "False"),
    ),
    ("losses/grpo.py", "GRPOLoss.__init__"): (
        ("self", _N), ("*", _N), ("config", "None"), ("impl", "'auto'"), ("batch_invariant", "False"), ("**fields", _N),
    ),
    ("losses/grpo.py", "GRPOLoss.forward"): (
        ("self", _N), ("hidden", _N), ("weight", _N), ("targets", _N), ("mask", _N), ("advantages", _N),
        ("**kwargs", _N),
    ),
    ("losses/policy.py", "policy_loss"): (
        ("logprobs", _N), ("advantages", _N), ("mask", _N), ("*", _N), ("old_logprobs", "None"),
        ("ref_logprobs", "None"), ("rollout_logprobs", "None"), ("entropy", "None"), ("config", "None"),
        ("normalizer", "None"), ("impl", "'auto'"),
    ),
    ("losses/config.py", "LossConfig"): (
        ("loss_agg", "'token-mean'"), ("eps_low", "0.2"), ("eps_high", "0.2"), ("dual_clip", "None"),
        ("beta", "0.0"), ("kl", "'k3'"), ("entropy_coef", "0.0"), ("temperature", "1.0"), ("ratio_level", "'token'"),
        ("max_completion_length", "None"), ("is_cap", "None"), ("pg_loss", "'clip'"),
        ("kl_bias_correction", "False"), ("kl_clip", "None"), ("is_level", "'token'"), ("is_mode", "'truncate'"),
        ("is_min", "None"), ("is_log_clip", "None"), ("off_policy_mask", "None"), ("top_entropy_quantile", "1.0"),
        ("entropy_agg", "'loss'"), ("count_empty_rows", "True"), ("sapo_tau_pos", "1.0"), ("sapo_tau_neg", "1.05"),
        ("vespo_k_pos", "2.0"), ("vespo_lambda_pos", "3.0"), ("vespo_k_neg", "3.0"), ("vespo_lambda_neg", "2.0"),
        ("rejection", "()"), ("top_k", "None"), ("top_p", "None"), ("min_p", "None"), ("softcap", "None"),
    ),
    ("kernels/sampler.py", "SamplerSettings"): (
        ("temperature", "1.0"), ("top_k", "None"), ("top_p", "None"), ("min_p", "None"), ("softcap", "None"),
    ),
    ("integrations/trl_compat.py", "loss_config_from_trl"): (("args", _N),),
    ("integrations/trl_compat.py", "trl_normalizer"): (
        ("args", _N), ("mask", _N), ("*", _N), ("num_items_in_batch", "None"), ("gradient_accumulation_steps", "None"),
        ("num_processes", "1"), ("training", "True"),
    ),
    ("integrations/verl_compat.py", "loss_config_from_verl"): (
        ("actor", _N), ("*", _N), ("rollout_correction", "None"), ("temperature", "1.0"),
    ),
    ("integrations/verl_compat.py", "verl_normalizer"): (
        ("config", _N), ("*", _N), ("dp_size", "1"), ("batch_num_tokens", "None"), ("global_batch_size", "None"),
    ),
    ("integrations/trl/head.py", "add_fastrl_lm_head"): (
        ("model", _N), ("temperature", "1.0"), ("cast_lm_head_to_fp32", "False"), ("impl", "'auto'"),
        ("sampler", "None"),
    ),
    ("integrations/trl/trainer.py", "use_fastrl"): (
        ("trainer", _N), ("*", _N), ("sampler_exact", "False"), ("keep_attention_outputs", "True"),
    ),
    ("integrations/trl/options.py", "check_args"): (("args", _N),),
    ("integrations/verl.py", "fastrl_policy_loss"): (
        ("old_log_prob", _N), ("log_prob", _N), ("advantages", _N), ("response_mask", _N),
        ("loss_agg_mode", "'token-mean'"), ("config", "None"), ("rollout_is_weights", "None"),
    ),
    ("integrations/verl.py", "use_fastrl_backend"): (),
    # verl calls the forward it installs with its model's keywords (verl and transformers fix these)
    ("integrations/verl.py", "forward_with_fastrl_backend"): (
        ("self", _N), ("input_ids", "None"), ("attention_mask", "None"), ("position_ids", "None"),
        ("past_key_values", "None"), ("inputs_embeds", "None"), ("labels", "None"), ("use_cache", "None"),
        ("output_attentions", "None"), ("output_hidden_states", "None"), ("return_dict", "None"),
        ("cache_position", "None"), ("logits_to_keep", "0"), ("temperature", "1.0"), ("shift_labels", "None"),
        ("**loss_kwargs", _N),
    ),
    # the ops' references (the oracles users compare with) and the policy op's entry, exported by fastrl.kernels
    ("kernels/logprobs/naive.py", "sampled_logprobs_reference"): (
        ("hidden", _N), ("weight", _N), ("targets", _N), ("bias", "None"), ("*", _N), ("temperature", "1.0"),
        ("softcap", "None"), ("top_k", "None"), ("top_p", "None"), ("min_p", "None"), ("ignore_index", "-100"),
        ("return_topk", "None"),
    ),
    ("kernels/logprobs/replay_naive.py", "replay_logprobs_reference"): (
        ("hidden", _N), ("weight", _N), ("targets", _N), ("kept_ids", _N), ("kept_offsets", _N), ("bias", "None"),
        ("*", _N), ("temperature", "1.0"), ("softcap", "None"), ("ignore_index", "-100"),
    ),
    ("kernels/policy/api.py", "policy_rows"): (
        ("logp", _N), ("advantages", _N), ("mask", _N), ("old", _N), ("ref", _N), ("weight", _N), ("entropy", _N),
        ("params", _N), ("*", _N), ("impl", "'auto'"),
    ),
}  # fmt: skip


@pytest.mark.parametrize("where", sorted(PUBLIC_SIGNATURES), ids=lambda w: w[1])
def test_public_signatures_are_pinned(where):
    # a user's call keeps working: a deliberate change edits this table and says so in the docs
    assert _signature(*where) == PUBLIC_SIGNATURES[where]
