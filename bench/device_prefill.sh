#!/usr/bin/env bash
# One device call: build, GPU tests, prefill benchmarks (logs under $OUT).
#   bench/device_prefill.sh [gtest filter] [bench filter] [extra: memcheck]
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
GT_FILTER=${1:-*}; BENCH_FILTER=${2:-prefill}; EXTRA=${3:-}; PROFILE=${4:-}
cmake -S . -B build -G Ninja -DDSV4_CUDA=ON >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build -j16 --target dsv4_gpu_tests dsv4 >"$OUT/build.log" 2>&1 || { grep -B5 -A20 error "$OUT/build.log" | head -80; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
timeout 240 ./build/dsv4_gpu_tests --gtest_filter="$GT_FILTER" 2>&1 | tee "$OUT/tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error|got|^\[==" | head -60
timeout 200 ./build/dsv4 bench --filter "$BENCH_FILTER" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
if [ "$EXTRA" = memcheck ]; then
  SAN="compute-sanitizer --print-limit 5"
  F='SparsePrefillEdge.*:Shapes/SparsePrefillGrid.*H64_d512_topk512*:Shapes/SparsePrefillGrid.*H128_d576_topk64*-*BitIdentical*'
  timeout 150 $SAN --tool memcheck ./build/dsv4_gpu_tests --gtest_filter="$F" >"$OUT/memcheck.log" 2>&1; tail -3 "$OUT/memcheck.log"
  timeout 150 $SAN --tool racecheck --racecheck-report all ./build/dsv4_gpu_tests --gtest_filter="$F:*ManyItems*" >"$OUT/racecheck.log" 2>&1; tail -3 "$OUT/racecheck.log"
  grep -m 12 -A6 "Error\|Warning" "$OUT/racecheck.log" | head -60
fi
if [ "$PROFILE" = ncu ]; then
  for c in prefill_d512_h128_d512_topk2048_skv8192_sink prefill_flash_h64_d512_topk512_skv8192_sink; do
    timeout 120 ncu --kernel-name regex:sparse_prefill_kernel --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
      ./build/dsv4 bench --filter "$c" --reps 20 --warmup 1 >"$OUT/ncu_$c.txt" 2>&1
    grep -E "Duration|Throughput|Hit Rate|L2 Cache|Stall|Issued|Eligible|Active Warps|Bandwidth" "$OUT/ncu_$c.txt" | head -40
  done
fi
