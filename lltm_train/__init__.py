"""lltm-train: training recurrent sequence models built on a fused LLTM cell.

The LLTM (Long-Long-Term Memory) is an LSTM without a forget gate and with ELU as the candidate
activation, from PyTorch's "Custom C++ and CUDA Extensions" tutorial.
"""

from importlib.metadata import PackageNotFoundError, version

from . import ops
from .backends import BACKENDS, available_backends

ops.load_if_built()  # saved models that call torch.ops.lltm.* then load after `import lltm_train` alone

try:
    __version__ = version("lltm-train")  # pyproject.toml is the one place that states it
except PackageNotFoundError:  # a source checkout used without installing
    __version__ = "unknown"
__all__ = ["BACKENDS", "available_backends", "__version__"]
