import pytest
import torch

import fastrl

N, D, V = 5, 8, 11


def _inputs(dtype=torch.float32):
    return torch.randn(N, D, dtype=dtype), torch.randn(V, D, dtype=dtype), torch.randint(0, V, (N,))


@pytest.mark.parametrize(
    "change, error, words",
    [
        pytest.param(lambda h, w, y: (h[:, :-1], w, y), ValueError, "last dim", id="width-mismatch"),
        pytest.param(lambda h, w, y: (h, w, y[:-1]), ValueError, "targets shape", id="targets-shape"),
        pytest.param(lambda h, w, y: (h, w, y.float()), TypeError, "torch.float32", id="float-targets"),
        pytest.param(lambda h, w, y: (h, w.double(), y), TypeError, "torch.float64", id="dtype-mismatch"),
        pytest.param(lambda h, w, y: (h, w, torch.full_like(y, V)), ValueError, f"target {V}", id="target-hi"),
        pytest.param(lambda h, w, y: (h, w, torch.full_like(y, -1)), ValueError, "target -1", id="target-neg"),
        pytest.param(lambda h, w, y: (h, w[None], y), ValueError, "weight must be [V, D]", id="weight-3d"),
        pytest.param(lambda h, w, y: (h.long(), w, y), TypeError, "hidden must be a floating", id="int-hidden"),
    ],
)
def test_bad_inputs_name_the_value(change, error, words):
    h, w, y = change(*_inputs())
    with pytest.raises(error, match=words.replace("[", r"\[").replace("]", r"\]")):
        fastrl.token_logprobs(h, w, y)


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_temperature(temperature):
    with pytest.raises(ValueError, match="temperature"):
        fastrl.token_logprobs(*_inputs(), temperature=temperature)


def test_bad_bias_shape():
    with pytest.raises(ValueError, match=r"bias must be \[V\] = \[11\], got shape \(10,\)"):
        fastrl.token_logprobs(*_inputs(), bias=torch.zeros(V - 1))


def test_unknown_impl():
    with pytest.raises(ValueError, match="'cuda-fast'"):
        fastrl.token_logprobs(*_inputs(), impl="cuda-fast")


def test_triton_on_cpu_needs_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        fastrl.token_logprobs(*_inputs(), impl="triton")


def test_ignore_index_is_allowed_outside_vocab():
    h, w, y = _inputs()
    y[1] = -100
    out = fastrl.token_logprobs(h, w, y)
    assert out[1] == 0 and torch.isfinite(out).all()
