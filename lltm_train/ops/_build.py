"""The sources and flags of the op library, shared by setup.py (ahead of time) and the just-in-time build.

Plain constants, no imports: setup.py reads this file without importing the package.
"""

CPP_SOURCES = ("lltm.cpp", "lltm_autograd.cpp", "lltm_cpu.cpp")
CUDA_SOURCES = ("lltm_cuda.cu", "lltm_cuda_persistent.cu", "lltm_cuda_stepped.cu")
CXX_FLAGS = ["-O3"]
CUDA_FLAGS = ["-O3"]
