"""The PEP 517 build backend of dsv4attn: scikit-build-core, plus the pinned CUTLASS headers as a
build requirement whenever the build will compile the CUDA kernels.

The CuTe/CUTLASS headers the kernels need come from the `nvidia-cutlass` wheel on PyPI (its
cutlass_library/source/include), pinned in cmake/cutlass_version.txt; CMakeLists.txt finds them
in the build environment (cmake/Cutlass.cmake). The wheel brings scipy, numpy, cuda-python and
more with it, so it is asked for only when CUDA is built: DSV4_CUDA is not OFF and an nvcc is in
sight. The test below errs toward asking: an unneeded download costs time, a missing one fails
the build.
"""
from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

from scikit_build_core import build as _skbuild
from scikit_build_core.build import *  # noqa: F401,F403  (every hook scikit-build-core has)

_ROOT = Path(__file__).resolve().parents[2]
_FALSE = {"OFF", "0", "FALSE", "NO", "N"}


def cutlass_requirement() -> str:
    return "nvidia-cutlass==" + (_ROOT / "cmake" / "cutlass_version.txt").read_text().strip()


def _dsv4_cuda_values(config_settings) -> list[str]:
    """Every value DSV4_CUDA is given: -C cmake.define.DSV4_CUDA=..., SKBUILD_CMAKE_DEFINE,
    CMAKE_ARGS (the three ways scikit-build-core takes CMake defines)."""
    values = []
    for key, value in (config_settings or {}).items():
        if key.split(".")[-1] == "DSV4_CUDA" and ".define." in f".{key}":
            values += [value] if isinstance(value, str) else list(value)
    for define in os.environ.get("SKBUILD_CMAKE_DEFINE", "").split(";"):
        name, _, value = define.partition("=")
        if name.split(":")[0].strip() == "DSV4_CUDA":
            values.append(value)
    for arg in shlex.split(os.environ.get("CMAKE_ARGS", "")):
        name, _, value = arg.removeprefix("-D").partition("=")
        if arg.startswith("-D") and name.split(":")[0] == "DSV4_CUDA":
            values.append(value)
    return [v.strip().upper() for v in values]


def _nvcc_in_sight() -> bool:
    """Where CMake's CUDA detection (and CMakeLists.txt's /usr/local/cuda fallback) looks."""
    if os.environ.get("CUDACXX") or shutil.which("nvcc"):
        return True
    roots = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH", "CUDAToolkit_ROOT")]
    return any(Path(r, "bin", "nvcc").exists() for r in [*roots, "/usr/local/cuda"] if r)


def builds_cuda(config_settings=None) -> bool:
    values = _dsv4_cuda_values(config_settings)
    if values and all(v in _FALSE for v in values):
        return False
    return bool(values and any(v not in _FALSE | {"AUTO"} for v in values)) or _nvcc_in_sight()


def _with_cutlass(requires: list[str], config_settings) -> list[str]:
    return [*requires, cutlass_requirement()] if builds_cuda(config_settings) else requires


def get_requires_for_build_wheel(config_settings=None):
    return _with_cutlass(_skbuild.get_requires_for_build_wheel(config_settings), config_settings)


def get_requires_for_build_editable(config_settings=None):
    return _with_cutlass(_skbuild.get_requires_for_build_editable(config_settings),
                         config_settings)
