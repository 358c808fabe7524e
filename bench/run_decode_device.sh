#!/usr/bin/env bash
# One device call: build, GPU tests, sanitizers on small cases, decode benchmarks.
# Usage (from the repository root on the GPU machine): bench/run_decode_device.sh [quick]
# Logs go to $OUT (or /tmp) and the short tables to stdout.
set -uo pipefail
LOG=${OUT:-/tmp}
cmake -S . -B build -G Ninja -DDSV4_CUDA=ON >/dev/null || exit 1
cmake --build build -j16 2>&1 | tail -5 || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
./build/dsv4_gpu_tests --gtest_brief=1 2>&1 | tee $LOG/gpu_tests.log | tail -25
if [ "${1:-}" != "quick" ]; then
  F='*tiny_topk3*:*odd_topk_h64*:*AllInvalid*:*Combine*'
  compute-sanitizer --tool memcheck ./build/dsv4_gpu_tests --gtest_filter="$F" --gtest_brief=1 2>&1 | tail -4
  compute-sanitizer --tool racecheck ./build/dsv4_gpu_tests --gtest_filter='*MatchesFloat64Reference/tiny_topk3*:*Combine*' --gtest_brief=1 2>&1 | tail -4
fi
./build/dsv4 bench decode 2>&1 | tee $LOG/bench_decode.txt
