#!/usr/bin/env bash
# Build (once) the environment holding verl's loss code and its FSDP2 engine for tests/peers and
# tests/integrations; print its python.
# verl 0.9 pins a transformers older than the test environment's, so it lives in its own venv, keyed on a
# hash of the pinned list below: a changed pin builds a fresh venv, an unchanged one is reused.
set -euo pipefail
REQS="torch==2.13.0
verl==0.9.0
numpy==2.4.6
packaging==25.0
pyyaml==6.0.4
omegaconf==2.4.0
tensordict==0.10.0
transformers==5.10.4
ray==2.60.0
codetiming==1.4.0
orjson==3.13.0
datasets==5.2.0
pillow==13.0.0
peft==0.21.2
accelerate==1.15.0"
HASH=$(printf '%s' "$REQS" | sha256sum | cut -c1-12)
VENV="${FASTRL_CACHE:-$HOME/.cache/fastrl}/venv-verl-$HASH"
PY="$VENV/bin/python"
# one build at a time: two test workers (pytest -n 2) may ask at once; the second waits, then reuses it
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock -w 3600 9 || { echo "verl.sh: $VENV.lock still held after an hour" >&2; exit 1; }
CHECK="import verl.trainer.ppo.core_algos, verl.trainer.ppo.rollout_corr_helper, verl.workers.utils.losses, verl.models.transformers.monkey_patch, verl.workers.engine.fsdp"
if ! "$PY" -c "$CHECK" >/dev/null 2>&1; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@" >&2; }
  # torch first, the CPU wheel, so that nothing pulls a CUDA build
  pip_install "$(grep '^torch==' <<<"$REQS")"
  # verl without its dependencies (a whole training stack), then the few its loss code and engine import
  pip_install --no-deps "$(grep '^verl==' <<<"$REQS")"
  grep -v -e '^torch==' -e '^verl==' <<<"$REQS" >"$VENV/requirements.txt"
  pip_install -r "$VENV/requirements.txt"
  "$PY" -c "$CHECK" >&2
fi
echo "$PY"
