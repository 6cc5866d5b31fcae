#!/usr/bin/env bash
# Trains a model; with no arguments, the default job (a character language model on Shakespeare).
# Arguments are Hydra overrides, e.g. scripts/train.sh dataset=smnist trainer.max_epochs=3 (see --help).
# Sets up .venv on first use. Runs write to ./outputs/<dataset>/<date_time>/.
source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh"
exec "$PY" -m lltm_train "$@"
