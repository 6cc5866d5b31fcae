"""``lltm-bench``: the speed and memory figures of BENCHMARKS.md (the command line: :mod:`.cli`).

The modules: :mod:`.common` (the configurations, the timer, the contenders of a layer and the check against
the python backend, which every mode shares), one module per mode (:mod:`.layers`, the default;
:mod:`.best`, ``--dtype best``; :mod:`.inference`; :mod:`.jit`; :mod:`.sweep`; :mod:`.training`) and
:mod:`.cli`, which parses the flags and runs one mode.
"""

from .cli import main

__all__ = ["main"]
