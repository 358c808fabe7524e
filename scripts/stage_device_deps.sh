#!/usr/bin/env bash
# Stages under third_party/ (git-ignored) what a build on the GPU device machine needs but cannot
# fetch there (it has no registry access): CUTLASS headers, GoogleTest sources, nlohmann-json.
# Carry `third_party` with the device call.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
mkdir -p third_party/nlohmann/include
rm -rf third_party/googletest third_party/nlohmann/include/nlohmann
cp -r /usr/src/googletest third_party/googletest
cp -r /usr/include/nlohmann third_party/nlohmann/include/nlohmann
# nanobind for building the Python extension there (bench/device_check.sh python puts it on
# PYTHONPATH); pure Python + sources, so one copy serves any Python version.
rm -rf third_party/pylib
python3 -m pip install -q --no-deps --target third_party/pylib nanobind==3.1.0
du -sh third_party
