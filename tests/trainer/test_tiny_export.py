"""The tiny pair written as a Hugging Face model directory (what `--engine vllm` loads), and the vLLM options."""

import importlib.util
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from fastrl.trainer import trainer as loop
from fastrl.trainer.config import make_config
from fastrl.trainer.rollout import check_engine_available
from fastrl.trainer.tiny import CharTokenizer, fast_tokenizer, save_tiny, tiny_model, tiny_tokenizer
from fastrl.trainer.tiny.model import CHARS, MARKUP

TEXTS = [
    "7+5=",
    "<think>7+5</think>\\boxed{12}",
    "</think></think><think>\\boxed{\\boxed",
    "a < b, </thin> <think \\box 'x'\n\"y\"_^ ?!",
    CHARS + "".join(MARKUP),
    "",
]


def test_fast_tokenizer_encodes_and_decodes_like_the_char_tokenizer():
    chars, fast = CharTokenizer(), fast_tokenizer(CharTokenizer())
    assert len(fast) == len(chars)
    for text in TEXTS:
        for special in (False, True):
            ids = chars.encode(text, add_special_tokens=special)
            assert fast.encode(text, add_special_tokens=special) == ids, text
        ids = chars.encode(text, add_special_tokens=True) + [chars.eos_token_id]
        for skip in (False, True):
            assert fast.decode(ids, skip_special_tokens=skip) == chars.decode(ids, skip_special_tokens=skip)
    assert (fast.pad_token_id, fast.bos_token_id, fast.eos_token_id) == (0, 1, 2)


def test_fast_tokenizer_of_the_tiny_tools_tokenizer_keeps_its_markup_and_unknown_token():
    chars = tiny_tokenizer(make_config("tiny-tools"))
    fast = fast_tokenizer(chars)
    assert len(fast) == len(chars) and fast.unk_token_id == chars.unk_token_id
    for text in [*TEXTS, "```python\nprint(12*34)\n```\n```output\n408\n\n```\n\\boxed{408}", "``` `` \t€"]:
        ids = chars.encode(text, add_special_tokens=True) + [chars.eos_token_id]
        assert fast.encode(text, add_special_tokens=True) == ids[:-1], text
        for skip in (False, True):
            assert fast.decode(ids, skip_special_tokens=skip) == chars.decode(ids, skip_special_tokens=skip)


def test_saved_directory_loads_back_with_auto_classes(tmp_path):
    chars = CharTokenizer()
    model = tiny_model(len(chars), max_len=64, seed=3).eval()
    save_tiny(model, chars, str(tmp_path))
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    ids = torch.tensor([tok.encode("<think>3+4</think>\\boxed{7}")])
    assert ids[0].tolist() == chars.encode("<think>3+4</think>\\boxed{7}", add_special_tokens=True)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("vllm_dtype", "fp8", "vllm_dtype='fp8': must be one of"),
        ("vllm_sleep_level", 3, "vllm_sleep_level=3: must be one of 0, 1, 2"),
        ("vllm_gpu_memory_utilization", 0.0, "vllm_gpu_memory_utilization=0.0: must be in (0, 1]"),
        ("vllm_gpu_memory_utilization", 1.5, "vllm_gpu_memory_utilization=1.5: must be in (0, 1]"),
        ("vllm_kv_cache_gib", -1.0, "vllm_kv_cache_gib=-1.0: must be >= 0"),
    ],
)
def test_bad_vllm_options_are_rejected(field, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make_config("tiny", **{field: value})


def test_missing_vllm_fails_before_the_model_is_built(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    monkeypatch.setattr(loop, "start_run", lambda config: pytest.fail("the run was started"))
    with pytest.raises(ImportError, match="engine='vllm' needs vLLM"):
        loop.train(make_config("tiny", engine="vllm", output_dir=str(tmp_path)))
    check_engine_available("hf")
