#!/usr/bin/env bash
# One device call: build, GPU tests, sanitizers on small cases, decode benchmarks.
# Usage (repository root on the GPU machine): [AB=<other tree>] bench/run_decode_device.sh [quick]
# AB: a second source tree (an earlier version) built alongside, tested and benchmarked too (all
# cases when this tree's tests fail, else the three target cases). Logs go to $OUT (or /tmp).
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
[ $OK -eq 0 ] && timeout 120 ./build/dsv4 bench decode 2>&1 | tee $LOG/bench_decode.txt
if [ -n "${AB:-}" ]; then
  wait
  echo "--- $AB"
  timeout 60 $AB/build/dsv4_gpu_tests --gtest_brief=1 2>&1 | tail -2
  if [ $OK -eq 0 ]; then
    for c in v32_b128_h128_sq2_topk2048 flash_b128_h64_sq2_128+512 pro_b128_h128_sq2_128+1024_blk64; do
      timeout 60 $AB/build/dsv4 bench decode --case $c | tail -1
    done
  else
    timeout 120 $AB/build/dsv4 bench decode 2>&1 | tee $LOG/bench_decode_ab.txt
  fi
fi
