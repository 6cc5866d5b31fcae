"""Builds the compiled op library ``lltm_train._C`` (metadata lives in pyproject.toml).

The CUDA kernels are compiled only when torch is a CUDA build and nvcc is found; the CPU kernels always.
Install with ``pip install --no-build-isolation -e .`` so the extension is built against the installed torch.
"""

import os
from pathlib import Path

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

sources = ["csrc/lltm.cpp", "csrc/lltm_cpu.cpp"]
with_cuda = torch.version.cuda is not None and CUDA_HOME is not None and Path(CUDA_HOME, "bin", "nvcc").exists()
if os.environ.get("LLTM_NO_CUDA") == "1":
    with_cuda = False
flags = {"cxx": ["-O3"]}
if with_cuda:
    flags["nvcc"] = ["-O3"]
    extension = CUDAExtension("lltm_train._C", sources + ["csrc/lltm_cuda.cu"], extra_compile_args=flags)
else:
    extension = CppExtension("lltm_train._C", sources, extra_compile_args=flags)

setup(
    packages=find_packages(include=["lltm_train*"]) + ["lltm_train.conf"],
    package_dir={"lltm_train.conf": "conf"},  # the Hydra configs, for installs that are not editable
    package_data={"lltm_train.conf": ["*.yaml", "*/*.yaml", "*/*/*.yaml"]},
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
