#!/usr/bin/env bash
# Profiling call: ncu sections of the decode kernel on two cases, then ablation builds (each
# removes one stage of the tile loop: 1 S, 2 fp8 convert, 3 gather loads, 4 P·V) timed on the same
# cases, to see which stage bounds the tile time. Usage: bench/profile_decode_device.sh
set -uo pipefail
LOG=${OUT:-/tmp}
cmake -S . -B build -G Ninja -DDSV4_CUDA=ON >/dev/null && cmake --build build -j16 --target dsv4 2>&1 | tail -1
for A in 1 2 3 4; do
  (cmake -S . -B build_a$A -G Ninja -DDSV4_CUDA=ON -DDSV4_BUILD_TESTS=OFF -DCMAKE_CUDA_FLAGS=-DDSV4_DECODE_ABLATE=$A >/dev/null && cmake --build build_a$A -j4 --target dsv4 >/dev/null 2>&1) &
done
CASES="v32_b128_h128_sq2_topk2048 flash_b128_h64_sq2_128+512"
for c in $CASES; do
  ncu -k regex:sparse_decode -s 3 -c 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis ./build/dsv4 bench decode --case $c --iters 1 > $LOG/ncu_$c.txt 2>&1
  grep -E "Duration|Throughput|Stall|Issued|Eligible|Active Warps|No Eligible|Pipe|L2 Hit|L1/TEX Hit|Mem Busy|Max Bandwidth|Warp Cycles" $LOG/ncu_$c.txt | head -40
done
wait
for c in $CASES; do
  echo "== $c"; ./build/dsv4 bench decode --case $c | tail -1
  for A in 1 2 3 4; do echo -n "ablate $A: "; ./build_a$A/dsv4 bench decode --case $c | tail -1; done
done
