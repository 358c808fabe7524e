"""The build backend asks for the pinned CUTLASS headers exactly when the build compiles CUDA:
DSV4_CUDA not OFF (however scikit-build-core is told) and an nvcc in sight of CMake."""
import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python", "backend"))
backend = pytest.importorskip("dsv4attn_backend", reason="needs scikit-build-core")

PIN = open(os.path.join(ROOT, "cmake", "cutlass_version.txt")).read().strip()


@pytest.fixture
def nvcc(monkeypatch, tmp_path):
    """nvcc_present(bool): a machine with or without an nvcc where CMake looks."""
    for var in ("CUDACXX", "CUDA_HOME", "CUDA_PATH", "CUDAToolkit_ROOT", "SKBUILD_CMAKE_DEFINE",
                "CMAKE_ARGS"):
        monkeypatch.delenv(var, raising=False)

    def set_present(present):
        monkeypatch.setattr(backend.shutil, "which", lambda name: "/x/nvcc" if present else None)
        real_exists = backend.Path.exists
        monkeypatch.setattr(backend.Path, "exists",
                            lambda p: False if str(p).endswith("/bin/nvcc") else real_exists(p))
    return set_present


@pytest.mark.parametrize("present", [True, False])
def test_auto_follows_nvcc(nvcc, present):
    nvcc(present)
    assert backend.builds_cuda({}) is present
    assert backend.builds_cuda({"cmake.define.DSV4_CUDA": "AUTO"}) is present
    requires = backend._with_cutlass(["scikit-build-core"], {})
    assert (f"nvidia-cutlass=={PIN}" in requires) is present


def test_off_never_asks(nvcc, monkeypatch):
    nvcc(True)
    assert not backend.builds_cuda({"cmake.define.DSV4_CUDA": "OFF"})
    assert not backend.builds_cuda({"cmake.define.DSV4_CUDA": "off"})
    monkeypatch.setenv("SKBUILD_CMAKE_DEFINE", "DSV4_CUDA=OFF;FOO=1")
    assert not backend.builds_cuda({})
    monkeypatch.delenv("SKBUILD_CMAKE_DEFINE")
    monkeypatch.setenv("CMAKE_ARGS", "-G Ninja -DDSV4_CUDA:STRING=OFF")
    assert not backend.builds_cuda({})


def test_on_always_asks(nvcc, monkeypatch):
    nvcc(False)
    assert backend.builds_cuda({"cmake.define.DSV4_CUDA": "ON"})
    # Contradicting settings: asking is the safe side.
    monkeypatch.setenv("CMAKE_ARGS", "-DDSV4_CUDA=ON")
    assert backend.builds_cuda({"cmake.define.DSV4_CUDA": "OFF"})


def test_cudacxx_counts_as_nvcc(nvcc, monkeypatch):
    nvcc(False)
    monkeypatch.setenv("CUDACXX", "/opt/cuda/bin/nvcc")
    assert backend.builds_cuda({})
