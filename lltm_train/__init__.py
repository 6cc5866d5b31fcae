"""lltm-train: training recurrent sequence models built on a fused LLTM cell.

The LLTM (Long-Long-Term Memory) is an LSTM without a forget gate and with ELU as the candidate
activation, from PyTorch's "Custom C++ and CUDA Extensions" tutorial.
"""

import os

# OpenMP's idle threads spin for a long while between parallel regions; on a 2-core machine that another process
# shares, that made training up to 8x slower (measured; 30000 keeps the idle speed and halves that loss). libgomp
# reads the setting once, when torch loads it: here, before `from . import ops` imports torch, so that every way
# of starting a run (lltm-train, python -m lltm_train, an installed wheel, scripts/) gets it. A process that
# imported torch first keeps OpenMP's default; a user's own GOMP_SPINCOUNT always wins.
os.environ.setdefault("GOMP_SPINCOUNT", "30000")

from importlib.metadata import PackageNotFoundError, version  # noqa: E402

from . import ops  # noqa: E402
from .backends import BACKENDS, available_backends  # noqa: E402

ops.load_if_built()  # saved models that call torch.ops.lltm.* then load after `import lltm_train` alone

try:
    __version__ = version("lltm-train")  # pyproject.toml is the one place that states it
except PackageNotFoundError:  # a source checkout used without installing
    __version__ = "unknown"
__all__ = ["BACKENDS", "available_backends", "__version__"]
