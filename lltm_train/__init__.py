"""lltm-train: training recurrent sequence models built on a fused LLTM cell.

The LLTM (Long-Long-Term Memory) is an LSTM without a forget gate and with ELU as the candidate
activation, from PyTorch's "Custom C++ and CUDA Extensions" tutorial.
"""

from importlib.metadata import PackageNotFoundError, version

from .backends import BACKENDS, available_backends

try:
    __version__ = version("lltm-train")  # pyproject.toml is the one place that states it
except PackageNotFoundError:  # a source checkout used without installing
    __version__ = "unknown"
__all__ = ["BACKENDS", "available_backends", "__version__"]
