"""fastrl against TRL's own GRPOTrainer loss (installed TRL, unmodified): every loss_type × vLLM IS mode ×
bias-corrected KL × ratio level, TRL's defaults, and gradient accumulation over 3 micro-batches."""

import itertools
import re
import zlib

import pytest
import torch
import trl
from parity_data import MICRO_BATCHES, TOL, err, make_batch, rel
from trl_peer import is_ratio, make_args, trainer_for, trl_loss

from fastrl import policy_loss
from fastrl.integrations import loss_config_from_trl, trl_normalizer
from fastrl.integrations.trl_compat import TRL_LOSS_TYPES

LOSS_TYPES = tuple(TRL_LOSS_TYPES)
IS_MODES = (None, "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def trl_fields(loss_type, is_mode, bias_kl, level):
    fields = dict(loss_type=loss_type, beta=0.04, use_bias_correction_kl=bias_kl, importance_sampling_level=level,
                  epsilon_high=0.28, max_completion_length=16)  # fmt: skip
    if loss_type == "cispo":
        fields["epsilon_high"] = 4.0
    if is_mode is not None:
        fields.update(use_vllm=True, vllm_importance_sampling_mode=is_mode, vllm_importance_sampling_clip_max=2.5)
        fields["vllm_importance_sampling_clip_min"] = 0.5 if is_mode.endswith("truncate") else 0.3
    return fields


def matrix():
    for loss_type, is_mode, bias_kl, level in itertools.product(
        LOSS_TYPES, IS_MODES, (True, False), ("token", "sequence")
    ):
        if loss_type == "vespo" and (level == "sequence" or (is_mode or "").startswith("sequence")):
            continue  # TRL: VESPO weights sequences itself and refuses sequence-level IS
        yield (
            f"{loss_type}-{is_mode}-{'biaskl' if bias_kl else 'kl'}-{level}",
            trl_fields(loss_type, is_mode, bias_kl, level),
        )


EXTRA = {
    # TRL's defaults: GRPOConfig() (dapo, no KL, no vLLM), and with vLLM (sequence_mask IS, cap 3)
    "default": {},
    "default-vllm": dict(use_vllm=True),
    "default-vllm-kl": dict(use_vllm=True, beta=0.04),
    "delta": dict(loss_type="grpo", delta=1.3, epsilon_high=0.28),
    "opsm": dict(loss_type="dapo", off_policy_mask_threshold=0.0),
    "opsm-vllm": dict(loss_type="grpo", use_vllm=True, off_policy_mask_threshold=0.02),
    "entropy-quantile": dict(loss_type="bnpo", top_entropy_quantile=0.3),
    "entropy-coef": dict(loss_type="grpo", entropy_coef=0.01),
    "entropy-coef-quantile": dict(loss_type="dr_grpo", entropy_coef=0.02, top_entropy_quantile=0.5),
    "sapo-temps": dict(loss_type="sapo", sapo_temperature_pos=0.7, sapo_temperature_neg=2.0),
    "vespo-params": dict(
        loss_type="vespo",
        vespo_k_pos=1.5,
        vespo_lambda_neg=1.0,
        use_vllm=True,
        vllm_importance_sampling_mode="token_truncate",
    ),  # fmt: skip
}
CASES = dict(matrix()) | EXTRA


def run_trl(fields, b, *, ga=1, num_processes=1, micro_batches=(tuple(range(12)),)):
    args = make_args(gradient_accumulation_steps=ga, **fields)
    trainer = trainer_for(args, num_processes=num_processes, ga=ga)
    logp = b["logp"].clone().requires_grad_(True)
    entropy = b["entropy"].clone().requires_grad_(True)
    use_is = args.use_vllm and args.vllm_importance_sampling_correction
    ratio = is_ratio(trainer, b["old"], b["rollout"], b["mask"]) if use_is else None
    sampling = b["rollout"] if args.use_vllm else None
    num_items = b["mask"].sum()
    total = 0
    for rows in micro_batches:
        rows = list(rows)
        total = total + trl_loss(
            trainer, logp[rows], entropy[rows], b["mask"][rows], b["adv"][rows], old=b["old"][rows],
            ref=b["ref"][rows], sampling=None if sampling is None else sampling[rows],
            is_ratio=None if ratio is None else ratio[rows], num_items=num_items,
        )  # fmt: skip
    total.backward()
    return args, total.detach(), logp.grad, entropy.grad


def run_fastrl(args, b, *, ga=1, num_processes=1, micro_batches=(tuple(range(12)),)):
    cfg = loss_config_from_trl(args)
    logp = b["logp"].clone().requires_grad_(True)
    entropy = b["entropy"].clone().requires_grad_(True)
    use_rollout = cfg.is_cap is not None or (cfg.off_policy_mask is not None and args.use_vllm)
    need_entropy = cfg.entropy_coef != 0 or cfg.top_entropy_quantile < 1
    total = 0
    for rows in micro_batches:
        rows = list(rows)
        norm = trl_normalizer(args, b["mask"][rows], num_items_in_batch=b["mask"].sum(),
                              gradient_accumulation_steps=ga, num_processes=num_processes)  # fmt: skip
        out = policy_loss(
            logp[rows], b["adv"][rows], b["mask"][rows], old_logprobs=b["old"][rows], ref_logprobs=b["ref"][rows],
            rollout_logprobs=b["rollout"][rows] if use_rollout else None,
            entropy=entropy[rows] if need_entropy else None, config=cfg, normalizer=norm, impl="torch",
        )  # fmt: skip
        total = total + out.loss
    total.backward()
    grad_h = entropy.grad if entropy.grad is not None else torch.zeros_like(entropy)
    return total.detach(), logp.grad, grad_h


def compare(fields, b, **kw):
    args, loss_t, g_t, h_t = run_trl(fields, b, **kw)
    loss_f, g_f, h_f = run_fastrl(args, b, **kw)
    h_t = torch.zeros_like(h_f) if h_t is None else h_t
    return err(loss_f, loss_t), err(g_f, g_t), err(h_f, h_t)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("name", list(CASES))
def test_trl_loss_matches(name, dtype):
    b = make_batch(dtype, seed=zlib.crc32(name.encode()) % 1000)
    d_loss, d_grad, d_h = compare(CASES[name], b)
    assert d_loss <= TOL and d_grad <= TOL and d_h <= TOL, (name, d_loss, d_grad, d_h)


@pytest.mark.parametrize("num_processes", [1, 2])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_trl_gradient_accumulation(loss_type, num_processes):
    """3 micro-batches of one optimizer step, each normalised by `trl_normalizer`, equal TRL's step."""
    fields = trl_fields(loss_type, "token_truncate", True, "token") | dict(entropy_coef=0.01)
    b = make_batch("fp32", seed=7)
    d_loss, d_grad, d_h = compare(fields, b, ga=3, num_processes=num_processes, micro_batches=MICRO_BATCHES)
    assert d_loss <= TOL and d_grad <= TOL and d_h <= TOL, (loss_type, d_loss, d_grad, d_h)


def test_the_loss_type_table_is_trls():
    # the loss types TRL's GRPOConfig says it supports (its field help), each reproduced by one table entry
    help_text = trl.GRPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    supported = help_text.split("Supported values are", 1)[1].split(". ", 1)[0]
    assert set(re.findall(r"'(\w+)'", supported)) == set(TRL_LOSS_TYPES)


def test_trl_default_config():
    """`loss_config_from_trl(GRPOConfig())`: TRL's default loss (dapo, ε = 0.2, no KL) and its vLLM default IS mode."""
    cfg = loss_config_from_trl(make_args())
    assert (cfg.loss_agg, cfg.eps_low, cfg.eps_high, cfg.beta, cfg.is_cap) == ("token-mean", 0.2, 0.2, 0.0, None)
    vllm = loss_config_from_trl(make_args(use_vllm=True))
    assert (vllm.is_level, vllm.is_mode, vllm.is_cap, vllm.kl_bias_correction) == ("sequence", "mask", 3.0, True)
    assert trl.__version__.startswith("1.")


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(use_liger_kernel=True), "use_liger_kernel"),
        (dict(use_adaptive_entropy=True), "use_adaptive_entropy"),
        (dict(loss_type="grpo", delta=1.1, epsilon_high=0.28), "delta"),
        (dict(use_vllm=True, vllm_importance_sampling_clip_max=None), "vllm_importance_sampling_clip_max"),
    ],
)
def test_trl_unsupported_raises(fields, named):
    args = make_args(**fields)  # the pinned TRL accepts each of these settings
    with pytest.raises(ValueError, match=named):
        loss_config_from_trl(args)


@pytest.mark.parametrize(
    "name, option",
    [
        ("delta", "delta"),
        ("opsm", "off_policy_mask_threshold"),
        ("opsm-vllm", "off_policy_mask_threshold"),
        ("entropy-quantile", "top_entropy_quantile"),
        ("entropy-coef", "entropy_coef"),
    ],
)
def test_trl_extra_cases_exercise_their_term(name, option):
    """Each extra case's option changes TRL's loss on the test batch (so its parity case can fail)."""
    b = make_batch("fp32", seed=zlib.crc32(name.encode()) % 1000)
    fields = dict(CASES[name])
    with_option = run_trl(fields, b)
    fields.pop(option)
    without = run_trl(fields, b)
    assert rel(with_option[1], without[1]) > 1e-3 or rel(with_option[2], without[2]) > 1e-3
