#!/usr/bin/env bash
# Runs the test suite (fast tests; slow end-to-end runs with -m slow, CUDA tests on a GPU with -m cuda).
# Arguments go to pytest. Sets up .venv on first use.
source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh"
cd "$ROOT"
exec "$PY" -m pytest "$@"
