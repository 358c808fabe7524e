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
du -sh third_party
