"""Builds the compiled op library ``lltm_train._C`` (metadata lives in pyproject.toml).

The CUDA kernels are compiled only when torch is a CUDA build and nvcc is found; the CPU kernels always.
Install with ``pip install --no-build-isolation -e .`` so the extension is built against the installed torch.
"""

import os
import runpy
from pathlib import Path

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

build = runpy.run_path(str(Path(__file__).parent / "lltm_train" / "ops" / "_build.py"))  # the JIT build's lists
sources = [f"csrc/{name}" for name in build["CPP_SOURCES"] + build["PYTHON_SOURCES"]]
with_cuda = torch.version.cuda is not None and CUDA_HOME is not None and Path(CUDA_HOME, "bin", "nvcc").exists()
if os.environ.get("LLTM_NO_CUDA") == "1":
    with_cuda = False
flags = {"cxx": build["CXX_FLAGS"]}
if with_cuda:
    flags["nvcc"] = build["CUDA_FLAGS"]
    sources += [f"csrc/{name}" for name in build["CUDA_SOURCES"]]
    extension = CUDAExtension("lltm_train._C", sources, extra_compile_args=flags)
else:
    extension = CppExtension("lltm_train._C", sources, extra_compile_args=flags)

setup(
    packages=find_packages(include=["lltm_train*"]) + ["lltm_train.conf"],
    package_dir={"lltm_train.conf": "conf"},  # the Hydra configs, for installs that are not editable
    package_data={"lltm_train.conf": ["*.yaml", "*/*.yaml", "*/*/*.yaml"]},
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
