"""fastrl.rewards is torch-free: importing it (or running a verifier worker) loads no torch, triton or numpy."""

import ast
import pathlib
import subprocess
import sys

import pytest

import fastrl
import fastrl.rewards

pytestmark = pytest.mark.slow  # every test here starts processes (workers, a CLI, a venv)

ROOT = pathlib.Path(fastrl.rewards.__file__).parent
HEAVY = ("torch", "triton", "numpy", "transformers", "sympy")


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    return names


def test_rewards_modules_import_neither_torch_nor_the_trainer():
    offenders = []
    for path in sorted(ROOT.glob("*.py")):
        for name in _imports(path):
            if name.split(".")[0] in ("torch", "triton", "numpy") or name.startswith("fastrl.trainer"):
                offenders.append(f"{path.name}: {name}")
    assert not offenders, offenders


def test_import_rewards_loads_nothing_heavy():
    code = "import sys, fastrl.rewards; print(sorted(m for m in sys.modules if m.split('.')[0] in %r))" % (HEAVY,)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_a_verifier_worker_loads_no_torch():
    # What a worker imports: the pool module (with the package __init__s above it) and the sympy side.
    code = (
        "import sys, fastrl.rewards.pool, fastrl.rewards.verify\n"
        "assert fastrl.rewards.verify.is_equiv('x+x', '2x')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'numpy', 'transformers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_lazy_top_level_names():
    import fastrl.kernels
    import fastrl.losses

    assert fastrl.token_logprobs is fastrl.kernels.token_logprobs
    for name in ("GRPOLoss", "LossConfig", "LossOutput", "grpo_loss", "policy_loss"):
        assert getattr(fastrl, name) is getattr(fastrl.losses, name)
    assert isinstance(fastrl.__version__, str)
    # subpackages resolve as attributes too: in a fresh process `fastrl.rewards` is not yet imported, so the
    # attribute goes through the package's __getattr__; an unknown name raises AttributeError
    code = (
        "import sys, fastrl\n"
        "assert 'fastrl.rewards' not in sys.modules\n"
        "assert fastrl.rewards is sys.modules['fastrl.rewards']\n"
        "try:\n    fastrl.no_such_name\nexcept AttributeError:\n    print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "ok", out
    assert "lm_body_and_head" in fastrl.__all__


def test_rewards_modules_stay_readable():
    long = {p.name: n for p in ROOT.glob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long
    missing = [p.name for p in ROOT.glob("*.py") if "__all__" not in p.read_text()]
    assert not missing, missing
