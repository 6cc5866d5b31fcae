#!/usr/bin/env bash
# Runs the test suite (fast tests; slow end-to-end runs with -m slow, CUDA tests on a GPU with -m cuda).
# Arguments go to pytest. Sets up .venv on first use. The tests run in parallel on every core (pytest-xdist,
# -n auto) when xdist is installed (the dev extra); -n N or -n 0 (one process) in the arguments wins. --dist worksteal:
# an idle worker takes tests queued on a busy one (the suite's end-to-end runs take 5-40 s, most tests well under 1 s;
# with the default, fixed shares, the suite took 563 s against 480 s, one run each on 2 AMD EPYC cores).
source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh"
cd "$ROOT"
parallel=()
if "$PY" -c 'import xdist' 2>/dev/null && [[ " $* " != *"no:xdist"* ]]; then parallel=(-n auto --dist worksteal); fi
exec "$PY" -m pytest ${parallel[@]+"${parallel[@]}"} "$@"
