#!/usr/bin/env bash
# One-time set-up on a fresh Debian machine: installs what is missing, nothing more.
#   - Debian packages: cmake, ninja, g++, GoogleTest, nlohmann-json
#   - when nvcc is present: the pinned CUTLASS/CuTe headers (cmake/cutlass_version.txt) from the
#     nvidia-cutlass wheel, into third_party/cutlass (`pip install .` needs no such step: there
#     the wheel is a build requirement)
# Idempotent: a second run does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

CUTLASS_VERSION=$(cat cmake/cutlass_version.txt)
need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in cmake ninja-build g++ make libgtest-dev nlohmann-json3-dev unzip python3-pip; do
  have_pkg "$p" || need+=("$p")
done
# python3 may come from pyenv rather than Debian; only ask for Debian's pip when there is no pip.
if python3 -m pip --version >/dev/null 2>&1; then
  need=("${need[@]/python3-pip}")
fi
# The Python tests' virtual environment needs venv + ensurepip (Debian splits them out).
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || need+=(python3-venv)
need=($(printf '%s\n' "${need[@]}" | grep -v '^$' || true))
if ((${#need[@]})); then
  echo "setup: installing Debian packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

nvcc_bin=$(command -v nvcc || true)
[ -z "$nvcc_bin" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc_bin=/usr/local/cuda/bin/nvcc
if [ -n "$nvcc_bin" ] && [ "${DSV4_CUDA:-AUTO}" != OFF ] &&
   [ "$(cat third_party/cutlass/VERSION 2>/dev/null)" != "$CUTLASS_VERSION" ]; then
  echo "setup: fetching CUTLASS ${CUTLASS_VERSION} headers (nvidia-cutlass wheel)"
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps "nvidia-cutlass==${CUTLASS_VERSION}" -d "$tmp"
  mkdir -p third_party/cutlass
  unzip -q -o "$tmp"/nvidia_cutlass-*.whl 'cutlass_library/source/include/*' -d "$tmp/x"
  rm -rf third_party/cutlass/include
  mv "$tmp/x/cutlass_library/source/include" third_party/cutlass/include
  echo "$CUTLASS_VERSION" > third_party/cutlass/VERSION
  rm -rf "$tmp"
fi

# ---- Python package (dsv4attn): a virtual environment for building and testing it ------------
# torch (the only runtime dependency), nanobind + scikit-build-core (build), pytest (tests).
# PyPI's Linux torch wheel is the CUDA build (torch ~0.5 GB + CUDA libraries ~3 GB, about 70 s to
# install here); it runs on CPU-only machines. DSV4_PYTHON=OFF skips this step.
DSV4_VENV=${DSV4_VENV:-.venv}
TORCH_VERSION=2.15.0
if [ "${DSV4_PYTHON:-AUTO}" != OFF ] &&
   ! "$DSV4_VENV/bin/python" -c "import torch, nanobind, pytest" >/dev/null 2>&1; then
  echo "setup: creating $DSV4_VENV (torch ${TORCH_VERSION}, nanobind, scikit-build-core, pytest)"
  python3 -m venv "$DSV4_VENV"
  "$DSV4_VENV/bin/python" -m pip install -q "torch==${TORCH_VERSION}" "nanobind==3.1.0" \
    "scikit-build-core==1.1.2" "pytest==9.2.0" numpy
fi
