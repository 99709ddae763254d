"""`--rollout-gpus`: checked at config time, from flags and YAML, on a CPU machine."""

import pytest
import torch

from fastrl.trainer.cli import main
from fastrl.trainer.config import ConfigError, make_config

ASYNC = dict(engine="vllm", async_staleness=1)


def test_ids_from_a_flag_and_from_yaml(tmp_path, capsys):
    assert make_config("tiny", **ASYNC, device="cuda", rollout_gpus="6, 7").rollout_gpus == "6, 7"
    assert make_config("tiny", **ASYNC).rollout_gpus == ""  # the default: the rollout process shares the GPU
    file = tmp_path / "run.yaml"
    file.write_text("engine: vllm\nasync_staleness: 1\ndevice: cuda\nrollout_gpus: 6,7\n")
    assert main(["train", "--preset", "tiny", "--config", str(file), "--print-config"]) == 0
    assert '"rollout_gpus": "6,7"' in capsys.readouterr().out


@pytest.mark.parametrize(
    "overrides, names",
    [
        pytest.param(dict(device="cuda"), ("rollout_gpus", "async_staleness"), id="without-async"),
        pytest.param(dict(**ASYNC, device="cpu"), ("rollout_gpus", "device='cpu'"), id="cpu-device"),
        pytest.param(dict(**ASYNC, device="cuda", rollout_gpus="6,6"), ("rollout_gpus", "GPU 6"), id="repeated"),
        pytest.param(dict(**ASYNC, device="cuda", rollout_gpus="6;7"), ("rollout_gpus", "'6;7'"), id="not-ids"),
    ],
)
def test_refusals_name_both_options(overrides, names):
    with pytest.raises(ConfigError) as e:
        make_config("tiny", **{"rollout_gpus": "6,7", **overrides})
    assert e.value.field == "rollout_gpus"
    for name in names:
        assert name in str(e.value), str(e.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="`auto` resolves to CUDA on a GPU machine")
def test_auto_device_without_a_gpu_is_refused(capsys):
    assert main(["train", "--preset", "tiny", "--engine", "vllm", "--async-staleness", "1", "--device", "auto",
                 "--rollout-gpus", "1", "--max-steps", "1"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "--rollout-gpus 1:" in err and "device='auto' runs on cpu" in err, err
