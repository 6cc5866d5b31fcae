"""Builds the compiled op library ``lltm_train._C`` (metadata lives in pyproject.toml, the dependencies here).

The CUDA kernels are compiled only when torch is a CUDA build and nvcc is found; the CPU kernels always.
Install with ``pip install --no-build-isolation -e .`` so the extension is built against the installed torch;
``scripts/wheel.sh`` builds a binary wheel. Either way the package requires the torch release it was compiled
against (a C++ extension only loads into the torch it was built for).
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
    extension = CUDAExtension("lltm_train._C", sources, extra_compile_args=flags, extra_link_args=build["LD_FLAGS"])
else:
    extension = CppExtension("lltm_train._C", sources, extra_compile_args=flags, extra_link_args=build["LD_FLAGS"])

DEPENDENCIES = [
    f"torch=={torch.__version__.split('+')[0]}",  # the build's torch; 2.13 (CPU) and 2.11 (CUDA) are the tested ones
    "lightning>=2.2",
    "torchmetrics>=1.0",
    "tensorboard>=2.12",
    "hydra-core>=1.3",
    "numpy",
    "statsmodels>=0.13",
    "ninja",
    "typeguard>=4",
    "hydra-submitit-launcher>=1.2",  # hydra/launcher=slurm and local (conf/hydra/launcher)
    "hydra-optuna-sweeper>=1.2",  # hparams_search=lm_optuna (conf/hparams_search)
    "matplotlib>=3.5",  # lltm-report's and lltm-bench --plot's plots
]

setup(
    install_requires=DEPENDENCIES,
    packages=find_packages(include=["lltm_train*"]) + ["lltm_train.conf"],
    package_dir={"lltm_train.conf": "conf"},  # the Hydra configs, for installs that are not editable
    package_data={"lltm_train.conf": ["*.yaml", "*/*.yaml", "*/*/*.yaml"]},
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
