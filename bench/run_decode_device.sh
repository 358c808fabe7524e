#!/usr/bin/env bash
# One device call: build, GPU tests, sanitizers on small cases, decode benchmarks.
# Usage (repository root on the GPU machine): [AB=<other tree>] bench/run_decode_device.sh [quick]
# AB: a second source tree (an earlier version) built alongside, tested and benchmarked too.
# Logs go to $OUT (or /tmp).
set -uo pipefail
LOG=${OUT:-/tmp}
if [ -n "${AB:-}" ]; then
  (cd $AB && cmake -S . -B build -G Ninja -DDSV4_CUDA=ON >/dev/null && cmake --build build -j8 >/dev/null 2>&1) &
fi
cmake -S . -B build -G Ninja -DDSV4_CUDA=ON >/dev/null || exit 1
cmake --build build -j8 2>&1 | tail -1 || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
timeout 60 ./build/dsv4_gpu_tests --gtest_brief=1 > $LOG/gpu_tests.log 2>&1
OK=$?
tail -4 $LOG/gpu_tests.log; echo "tests rc=$OK"
if [ $OK -eq 0 ] && [ "${1:-}" != "quick" ]; then
  F='*tiny_topk3*:*odd_topk_h64*:*AllInvalid*:*Combine*:*pro_h128_b1_sq2_blk2_direct*'
  timeout 60 compute-sanitizer --tool memcheck ./build/dsv4_gpu_tests --gtest_filter="$F" --gtest_brief=1 2>&1 | tail -2
  timeout 60 compute-sanitizer --tool racecheck ./build/dsv4_gpu_tests --gtest_filter='*MatchesFloat64Reference/tiny_topk3*:*MatchesFloat64Reference/odd_topk_h64*:*Combine*' --gtest_brief=1 2>&1 | tail -2
  timeout 40 compute-sanitizer --tool synccheck ./build/dsv4_gpu_tests --gtest_filter='*MatchesFloat64Reference/tiny_topk3*:*MatchesFloat64Reference/odd_topk_h64*' --gtest_brief=1 2>&1 | tail -2
fi
[ $OK -eq 0 ] && timeout 120 ./build/dsv4 bench --filter decode_ --json $LOG/bench_decode.json 2>&1 | tee $LOG/bench_decode.txt
if [ -n "${AB:-}" ]; then
  wait
  echo "--- $AB"
  timeout 60 $AB/build/dsv4_gpu_tests --gtest_brief=1 2>&1 | tail -2
  timeout 120 $AB/build/dsv4 bench --filter decode_ 2>&1 | tee $LOG/bench_decode_ab.txt
fi
