"""``python -m lltm_train.bench``: the same as ``lltm-bench``."""

from .cli import main

main()
