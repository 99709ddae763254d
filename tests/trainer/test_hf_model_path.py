"""The non-tiny path: a Hugging Face model directory + tokenizer + a JSONL dataset (all built locally)."""

import json

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from fastrl.losses import LossConfig
from fastrl.trainer.batching import Sample
from fastrl.trainer.config import make_config
from fastrl.trainer.metrics import read_metrics
from fastrl.trainer.rollout import build_prompt
from fastrl.trainer.trainer import train
from fastrl.trainer.update import StepSettings, train_step


def _local_model(path):
    chars = list("0123456789+=<>/{}\\abcdefghijklmnopqrstuvwxyz ")
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + chars)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tok.save_pretrained(path)
    cfg = Qwen2Config(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    return tok


def test_hf_directory_and_jsonl_dataset(tmp_path):
    tok = _local_model(tmp_path / "model")
    assert tok.decode(tok.encode("12+3=")) == "12+3="
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a}+{a}", "gold": str(2 * a)}) + "\n" for a in range(10)))
    cfg = make_config(model=str(tmp_path / "model"), dataset=str(data), prompt_key="question", answer_key="gold",
                      prompt_template="{prompt}=", rewards=("accuracy:1.0",), output_dir=str(tmp_path / "run"),
                      max_steps=2, prompts_per_step=4, group_size=2, max_completion_length=6, progress=False,
                      device="cpu", gradient_checkpointing=True)  # fmt: skip
    train(cfg)
    rows = read_metrics(str(tmp_path / "run"))
    assert [r["step"] for r in rows] == [1, 2]
    assert (tmp_path / "run" / "checkpoints" / "step-00000002" / "state.pt").exists()


def test_untied_head_and_embedding_both_get_gradients(tmp_path):
    _local_model(tmp_path / "model")
    model = Qwen2ForCausalLM.from_pretrained(tmp_path / "model")
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    samples = [Sample([1, 5, 6], [7, 8, 2], 1.0), Sample([1, 9], [10, 2], -1.0)]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    train_step(model, opt, samples, StepSettings(LossConfig(), 64, True, 0, max_grad_norm=0))
    for name in ("lm_head.weight", "model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight"):
        assert not torch.equal(dict(model.named_parameters())[name], before[name]), name


def test_chat_template_prompt(tmp_path):
    tok = _local_model(tmp_path / "model")
    tok.chat_template = (
        "{% for m in messages %}<{{ m['content'] }}>{% endfor %}{% if add_generation_prompt %}={% endif %}"
    )
    ids = build_prompt(tok, "1+2", "{prompt}", chat=True, max_length=64)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == "<1+2>="
    assert build_prompt(tok, "1+2", "{prompt}", chat=True, max_length=3) == ids[-3:]  # left-truncated
