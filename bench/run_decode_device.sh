#!/usr/bin/env bash
# One device call: build, GPU tests, sanitizers on small cases, decode benchmarks.
# Usage (from the repository root on the GPU machine): bench/run_decode_device.sh [quick]
# Logs go to $OUT (or /tmp) and the short tables to stdout.
set -uo pipefail
LOG=${OUT:-/tmp}
cmake -S . -B build -G Ninja -DDSV4_CUDA=ON >/dev/null || exit 1
cmake --build build -j16 2>&1 | tail -3 || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
cuobjdump -sass build/libdsv4attn.a 2>/dev/null | grep -oE "(HGMMA|HMMA)\.[0-9A-Za-z]+" | sort | uniq -c
./build/dsv4_gpu_tests --gtest_brief=1 2>&1 | tee $LOG/gpu_tests.log | tail -25
if [ -n "${AB:-}" ]; then
  DSV4_DECODE_MMA_SYNC=1 ./build/dsv4_gpu_tests --gtest_brief=1 2>&1 | tail -3
fi
if [ "${1:-}" != "quick" ]; then
  F='*tiny_topk3*:*odd_topk_h64*:*AllInvalid*:*Combine*:*pro_h128_b1_sq2_blk2_direct*'
  compute-sanitizer --tool memcheck ./build/dsv4_gpu_tests --gtest_filter="$F" --gtest_brief=1 2>&1 | tail -3
  compute-sanitizer --tool racecheck ./build/dsv4_gpu_tests --gtest_filter='*MatchesFloat64Reference/tiny_topk3*:*MatchesFloat64Reference/odd_topk_h64*:*Combine*' --gtest_brief=1 2>&1 | tail -3
  compute-sanitizer --tool synccheck ./build/dsv4_gpu_tests --gtest_filter='*MatchesFloat64Reference/tiny_topk3*' --gtest_brief=1 2>&1 | tail -2
fi
./build/dsv4 bench decode 2>&1 | tee $LOG/bench_decode.txt
if [ -n "${AB:-}" ]; then
  echo "--- mma.sync"; DSV4_DECODE_MMA_SYNC=1 ./build/dsv4 bench decode --case v32_b128_h128_sq2_topk2048
  DSV4_DECODE_MMA_SYNC=1 ./build/dsv4 bench decode --case flash_b128_h64_sq2_128+512 | tail -1
fi
