"""The sources and flags of the op library, shared by setup.py (ahead of time), the just-in-time build and
CMakeLists.txt (``liblltm_ops.so``).

Plain constants, no imports: setup.py and CMake read this file without importing the package.
"""

CPP_SOURCES = ("lltm.cpp", "lltm_autograd.cpp", "lltm_cpu.cpp")
CUDA_SOURCES = ("lltm_cuda.cu", "lltm_cuda_persistent.cu", "lltm_cuda_stepped.cu")
PYTHON_SOURCES = ("lltm_python.cpp",)  # the module init of lltm_train._C: setup.py only
# -fopenmp: without it ATen's parallel_for (a header template) compiles to a serial loop, and the CPU time
# loop's split of the batch rows over threads ran on one thread (torch's own libgomp serves the pragmas).
# -fno-trapping-math: floating-point operations raise no traps (none are enabled; it changes no value), so GCC
# may compute both sides of a choice and select, where it otherwise keeps a branch around any side that could
# trap (a division, an int-to-float conversion) and leaves the CPU loop scalar: the sLSTM's pointwise loops
# (first step or not, which side of the stabilizer's max) vectorise only with it.
CXX_FLAGS = ["-O3", "-g0", "-fopenmp", "-fno-trapping-math"]
LD_FLAGS = ["-fopenmp"]
CUDA_FLAGS = ["-O3"]
