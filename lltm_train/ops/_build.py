"""The sources and flags of the op library, shared by setup.py (ahead of time), the just-in-time build and
CMakeLists.txt (``liblltm_ops.so``).

Plain constants, no imports: setup.py and CMake read this file without importing the package.
"""

CPP_SOURCES = ("lltm.cpp", "lltm_autograd.cpp", "lltm_cpu.cpp")
CUDA_SOURCES = ("lltm_cuda.cu", "lltm_cuda_persistent.cu", "lltm_cuda_stepped.cu")
PYTHON_SOURCES = ("lltm_python.cpp",)  # the module init of lltm_train._C: setup.py only
# -fopenmp: without it ATen's parallel_for (a header template) compiles to a serial loop, and the CPU time
# loop's split of the batch rows over threads ran on one thread (torch's own libgomp serves the pragmas).
CXX_FLAGS = ["-O3", "-g0", "-fopenmp"]
LD_FLAGS = ["-fopenmp"]
CUDA_FLAGS = ["-O3"]
