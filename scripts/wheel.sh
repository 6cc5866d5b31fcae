#!/usr/bin/env bash
# Builds a binary wheel, dist/lltm_train-<version>-<python>-<platform>.whl, with the compiled op library
# (CPU kernels; CUDA kernels too when .venv's torch is a CUDA build and nvcc is found; LLTM_NO_CUDA=1 leaves
# them out). It installs where no compiler is: `pip install dist/lltm_train-*.whl` (it requires the torch
# release it was built against: the one in .venv). Arguments go to `pip wheel`.
source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh"
cd "$ROOT"
echo "lltm-train: building the wheel (into dist/ unless -w says otherwise): compiling the extension's C++ (and CUDA) kernels, about a minute" >&2
"$PY" -m pip wheel --quiet --disable-pip-version-check --no-build-isolation --no-deps -w dist "$@" .
echo "lltm-train: wheel built in $SECONDS s" >&2
