"""One temperature rule, one "is the sampler on", one router (docs/math.md §1, §6, §8).

token_logprobs and sampled_token_logprobs share the router and never call each other; per-token τ with a bias
and a soft-cap is one rule on every path; the vocab-parallel path refuses the truncation rules by name.
"""

import pytest
import torch

from fastrl.kernels import MIN_TEMPERATURE, check_temperature, sampler_on
from fastrl.kernels.logprobs import api
from fastrl.kernels.logprobs.naive import sampled_logprobs_reference

N, D, V = 13, 8, 31


def make(seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden, weight = torch.randn(N, D, generator=g), torch.randn(V, D, generator=g) * 0.5
    bias, targets = torch.randn(V, generator=g), torch.randint(0, V, (N,), generator=g)
    targets[::4] = -100
    return hidden, weight, bias, targets


def test_one_temperature_floor_everywhere():
    hidden, weight, bias, targets = make()
    small = MIN_TEMPERATURE / 10
    calls = {
        "check_temperature": lambda: check_temperature(small),
        "token_logprobs": lambda: api.token_logprobs(hidden, weight, targets, temperature=small),
        "per-token": lambda: api.token_logprobs(hidden, weight, targets, temperature=torch.full((N,), small)),
        "sampled": lambda: api.sampled_token_logprobs(hidden, weight, targets, temperature=small, top_k=3),
        # the gradient-in-forward pass runs on this checked call
        "logprob_call": lambda: api.logprob_call(
            hidden, weight, targets, api.LogprobRequest(temperature=small, impl="torch")
        ),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match="MIN_TEMPERATURE"):
            call()
    check_temperature(MIN_TEMPERATURE)  # the floor itself is allowed


def test_sampler_on_is_one_rule():
    assert not sampler_on() and not sampler_on(top_k=0, top_p=1.0, min_p=0.0)
    assert sampler_on(top_k=5) and sampler_on(top_p=0.9) and sampler_on(min_p=0.1) and sampler_on(softcap=30.0)
    assert sampler_on(top_k=torch.tensor([0, 3]))  # a tensor is judged row by row later: on


def _bomb(*args, **kwargs):
    raise AssertionError("token_logprobs and sampled_token_logprobs must not call each other")


def test_entry_points_do_not_call_each_other(monkeypatch):
    hidden, weight, bias, targets = make()
    plain = api.token_logprobs(hidden, weight, targets, bias=bias)
    capped = api.sampled_token_logprobs(hidden, weight, targets, bias=bias, softcap=5.0).logp
    monkeypatch.setattr(api, "token_logprobs", _bomb)
    out = api.sampled_token_logprobs(hidden, weight, targets, bias=bias)  # everything off: the plain path
    torch.testing.assert_close(out.logp, plain, rtol=0, atol=0)
    assert not out.outside.any()
    monkeypatch.undo()
    monkeypatch.setattr(api, "sampled_token_logprobs", _bomb)
    torch.testing.assert_close(api.token_logprobs(hidden, weight, targets, bias=bias, softcap=5.0), capped)


@pytest.mark.parametrize(
    "options, path",
    [
        ({}, "plain"),
        ({"top_p": 1.0, "top_k": 0}, "plain"),
        ({"top_k": 3}, "sampled"),
        ({"softcap": 5.0}, "sampled"),
        ({"return_topk": 2}, "sampled"),
        ({"temperature": "tok"}, "sampled"),
    ],
    ids=["off", "rules-off", "top-k", "cap", "topk-export", "tau-per-token"],
)
def test_route(monkeypatch, options, path):
    hidden, weight, bias, targets = make()
    if options.get("temperature") == "tok":
        options = {"temperature": torch.rand(N) + 0.5}
    seen = []
    real = api.route
    monkeypatch.setattr(api, "route", lambda call: seen.append(real(call)) or seen[-1])
    api.token_logprobs(hidden, weight, targets, bias=bias, **options)
    assert seen == [path]


@pytest.mark.parametrize("softcap", [None, 3.0], ids=["bias", "bias-cap"])
def test_per_token_tau_with_bias_and_cap_is_the_reference(softcap):
    # the old plain path refused a per-token τ with a bias; the rule is z = softcap(h·W + b) / τ_n
    hidden, weight, bias, targets = make(1)
    tau = torch.rand(N) + 0.5
    leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    logp, ent = api.token_logprobs(
        leaves[0], leaves[1], targets, bias=leaves[2], temperature=tau, softcap=softcap, return_entropy=True,
        impl="torch",
    )  # fmt: skip
    (logp.sum() + ent.sum()).backward()
    ref = [t.double().requires_grad_() for t in (hidden, weight, bias)]
    want = sampled_logprobs_reference(ref[0], ref[1], targets, ref[2], temperature=tau.double(), softcap=softcap)
    (want["logp"].sum() + want["entropy"].sum()).backward()
    torch.testing.assert_close(logp.double(), want["logp"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), want["entropy"], rtol=1e-5, atol=1e-5)
    for got, exp in zip(leaves, ref):
        torch.testing.assert_close(got.grad.double(), exp.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name, value", [("top_k", 5), ("top_p", 0.9), ("min_p", 0.1), ("return_topk", 3)])
def test_vocab_parallel_refuses_the_sampler_by_name(name, value):
    hidden, weight, bias, targets = make()
    with pytest.raises(ValueError, match=f"{name}={value} is not supported with process_group"):
        api.token_logprobs(hidden, weight, targets, process_group=object(), **{name: value})
    # off values and a soft-cap are no refusal: the call goes on to the group's checks
    with pytest.raises(ValueError, match="not initialized"):
        api.token_logprobs(hidden, weight, targets, process_group=object(), top_k=0, top_p=1.0, softcap=5.0)


def test_logprob_call_takes_one_request():
    hidden, weight, _, targets = make()
    with pytest.raises(TypeError, match="request must be a LogprobRequest, got dict"):
        api.logprob_call(hidden, weight, targets, {"impl": "torch"})
    call, lead = api.logprob_call(hidden, weight, targets, api.LogprobRequest(impl="torch"))
    assert lead == targets.shape and call.params.ignore_index == -100 and call.kept is None
