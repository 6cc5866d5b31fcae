"""The LLTM op library: ``torch.ops.lltm.*`` (C++/CUDA) and the pure-PyTorch reference."""

from ._extension import has_cuda_kernels, load, load_error, load_if_built

__all__ = ["has_cuda_kernels", "load", "load_error", "load_if_built"]
