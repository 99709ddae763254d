"""`fastrl.losses` reaches the kernels only through `fastrl.kernels`' public names."""

import ast
import pathlib

import pytest

import fastrl.kernels
import fastrl.losses

ROOT = pathlib.Path(fastrl.losses.__file__).parent
MODULES = sorted(ROOT.rglob("*.py"))


def test_losses_import_only_public_kernel_names():
    offenders = []
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                bad = [a.name for a in node.names if a.name.split(".")[0] == "triton"]
                bad += [a.name for a in node.names if a.name.startswith("fastrl.kernels")]
                offenders += [f"{path.name}: import {name}" for name in bad]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fastrl.kernels"):
                private = [a.name for a in node.names if a.name not in fastrl.kernels.__all__]
                if node.module != "fastrl.kernels" or private:
                    offenders.append(f"{path.name}: from {node.module} import {[a.name for a in node.names]}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "triton":
                offenders.append(f"{path.name}: from {node.module}")
    assert not offenders, offenders


def test_every_module_declares_all_and_stays_readable():
    missing = [p.name for p in MODULES if "__all__" not in p.read_text()]
    long = {p.name: n for p in MODULES if (n := len(p.read_text().splitlines())) > 400}
    assert not missing and not long, (missing, long)


# --- the stack from grpo_loss to the first kernel: grpo.py, route.py, the path's walk, then the logit tile (logits.py)
# or the Triton launch (`kernel[grid]`) ---
FIRST_TILES = {
    ("fastrl.kernels.logits", "logit_tile"),
    ("fastrl.kernels.logprobs.replay_torch", "_pair_logits"),
    ("triton.runtime.jit", "__getitem__"),
}


def _modules_at_first_tile(fn) -> list[str]:
    """The fastrl modules on the call stack, outermost first, when fn first enters a logit-tile function or launches
    a Triton kernel."""
    import sys

    hit = []

    def profile(frame, event, arg):
        key = (frame.f_globals.get("__name__"), frame.f_code.co_name)
        if event == "call" and not hit and key in FIRST_TILES:
            stack = []
            while frame is not None:
                stack.append(frame.f_globals.get("__name__", ""))
                frame = frame.f_back
            hit.append(stack[::-1])

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    assert hit, "no logit tile was computed"
    names = [m for m in hit[0] if m.startswith("fastrl.")]
    return list(dict.fromkeys(names[names.index("fastrl.losses.grpo") :]))


def _route_calls(impl):
    import torch

    from fastrl.losses import LossConfig, grpo_loss

    torch.manual_seed(0)
    h = torch.randn(2, 5, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    y, m, a = torch.randint(0, 50, (2, 5)), torch.ones(2, 5), torch.randn(2)
    ids, offsets = [], [0]
    for t in y.reshape(-1).tolist():
        ids += sorted({t, 1, 2, 3})
        offsets.append(len(ids))
    kept = dict(kept_ids=torch.tensor(ids), kept_offsets=torch.tensor(offsets))
    plain = LossConfig()
    return {
        "plain": lambda: torch.no_grad()(grpo_loss)(h, w, y, m, a, config=plain, impl=impl),
        "sampled": lambda: grpo_loss(h, w, y, m, a, config=LossConfig(top_k=5), impl=impl),
        "gspo": lambda: grpo_loss(h, w, y, m, a, config=LossConfig(ratio_level="sequence"), impl=impl),
        "replay": lambda: grpo_loss(h, w, y, m, a, config=plain, impl=impl, **kept),
        "fused": lambda: grpo_loss(h, w, y, m, a, config=plain, impl=impl),  # a gradient to form: in the forward
    }


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_grpo_loss_reaches_the_first_kernel_through_four_modules(impl, monkeypatch):
    # the router runs the log-prob op's path, or the gradient-in-forward walk, itself: no public entry or
    # pass-through layer in between (the Triton kernels under the interpreter)
    from fastrl.kernels.fused_loss import api as fused_api

    walks = []
    real = fused_api.fused_forward
    monkeypatch.setattr(fused_api, "fused_forward", lambda *args: walks.append(1) or real(*args))
    for name, fn in _route_calls(impl).items():
        walks.clear()
        mods = _modules_at_first_tile(fn)
        assert len(mods) <= 4, (name, mods)
        assert mods[:2] == ["fastrl.losses.grpo", "fastrl.losses.route"], (name, mods)
        assert bool(walks) == (name == "fused"), (name, walks)
