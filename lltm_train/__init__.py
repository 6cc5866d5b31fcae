"""lltm-train: training recurrent sequence models built on a fused LLTM cell.

The LLTM (Long-Long-Term Memory) is an LSTM without a forget gate and with ELU as the candidate
activation, from PyTorch's "Custom C++ and CUDA Extensions" tutorial.
"""

from .backends import BACKENDS, available_backends

__version__ = "0.1.0"
__all__ = ["BACKENDS", "available_backends", "__version__"]
