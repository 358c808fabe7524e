// l2_gather_ceiling: how fast can the SMs of this GPU gather random whole rows of an L2-resident
// table, with nothing else running? The sparse prefill moves every K/V row it uses from L2 into
// shared memory (its producer's cp.async), and at full load its tile time follows the bytes it
// gathers (docs/notes/prefill.md, "What each bound costs, by ablation"). This measures the rate to
// read those bytes against: no math, only the gather, by three mechanisms:
//   cpasync  — 16-byte cp.async.cg (L2::256B), as the prefill's producer issues them, T threads
//              per CTA, consecutive lanes on consecutive 16 bytes of a row, `stages` tiles in
//              flight per thread (cp.async groups); optionally also a store of 1/8 of each tile's
//              bytes (the prefill's O beside V4-Flash's reads: do writes share the path?);
//   ldg      — 16-byte ld.global.nc into registers (folded into a checksum), the same lanes, one
//              or two 1024-thread CTAs an SM;
//   bulk     — cp.async.bulk of one whole row per instruction (one lane per row), completing on
//              an mbarrier per stage (its smem layout is not the one wgmma needs).
// "pairs": CTAs 2i and 2i + 1 read the same rows, as the two head groups of an H 128 token do.
// The rows are hashed, not loaded: an index load before each copy would put its latency on the
// path being measured. A tile is 64 random rows of `row_bytes` (1152: d 576 bf16; 1024: d 512)
// of a table of `rows` rows (8192 × 1152 B = 9.4 MB stays in L2). Prints, per mechanism and CTA
// count, the µs per tile per CTA, the total TB/s and the bytes per SM cycle (the SM clock from
// clock64 over globaltimer in CTA 0). The rate grows with the copies in flight an SM (threads ×
// stages): the highest row is a lower bound on the SM's path from L2, not the path itself.
//
// Build and run (device):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o /tmp/l2g bench/experiments/l2_gather_ceiling.cu
//   /tmp/l2g [row_bytes] [rows] [cluster]
// With "cluster" it runs only the 384-thread cp.async at every SM, with and without pairs, each
// launched plainly and as clusters of 2 CTAs; under Nsight Compute's lts__t_sectors_* counters
// that asks whether two SMs reading the same rows at once read fewer L2 sectors (2026-11-30,
// H200: 4 % fewer in pairs, clusters or not; FlashMLA's H 128 prefill reads ~30 % fewer).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK(x)                                                                               \
  do {                                                                                         \
    cudaError_t e = (x);                                                                       \
    if (e != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

constexpr int kTileRows = 64;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

struct Args {
  const uint8_t* table;
  int rows;  // row r of tile t of CTA b is random_row(b, t, r) % rows
  int row_bytes, tiles, stages;
  int pair_shift;  // 1: CTAs 2i and 2i + 1 gather the same rows (an H 128 token's two head groups)
  int write_div;  // cpasync only: each tile also stores tile bytes / write_div to `out` (0: none)
  uint4* out;     // per CTA: tile bytes / write_div, rewritten every tile
  unsigned long long* clocks;  // CTA 0: {clock64 start, end, globaltimer start, end}
  uint32_t* sink;
};

// A random row, computed rather than loaded: an index load ahead of every copy would put its
// latency on the gather's path (the prefill's producer loads its indices a tile ahead), and the
// ceiling is about the copies alone.
__device__ __forceinline__ int random_row(const Args& a, int t, int r) {
  uint32_t h = ((blockIdx.x >> a.pair_shift) * 0x9E3779B1u) ^ (t * 0x85EBCA77u) ^ (r * 0xC2B2AE3Du);
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 12;
  return static_cast<int>(h % static_cast<uint32_t>(a.rows));
}

__device__ __forceinline__ void clock_mark(const Args& a, int which) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    a.clocks[which] = clock64();
    a.clocks[2 + which] = ns;
  }
}

__global__ void gather_cpasync(Args a) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const int chunks = kTileRows * a.row_bytes / 16, per_row = a.row_bytes / 16;
  const int tile_bytes = kTileRows * a.row_bytes;
  clock_mark(a, 0);
  for (int t = 0; t < a.tiles; ++t) {
    uint8_t* stage = smem + (t % a.stages) * tile_bytes;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
      const int row = c / per_row, col = c % per_row;
      const uint8_t* src = a.table + int64_t{random_row(a, t, row)} * a.row_bytes + col * 16;
      asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(smem_u32(stage + c * 16)), "l"(src)
                   : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    // The output an attention item writes beside its gathers (the prefill's O is 1/8 of V4-Flash's
    // item reads): does it share the SM's path to L2 with the reads?
    if (a.write_div) {
      const int out_chunks = chunks / a.write_div;
      uint4* out = a.out + int64_t{blockIdx.x} * out_chunks;
      for (int c = threadIdx.x; c < out_chunks; c += blockDim.x) out[c] = make_uint4(t, c, 0, 0);
    }
    // At most stages - 1 tiles in flight behind this one before the next overwrites a stage.
    switch (a.stages) {
      case 2: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
      case 3: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
      default: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    }
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  __syncthreads();
  clock_mark(a, 1);
}

__global__ void gather_ldg(Args a) {
  const int chunks = kTileRows * a.row_bytes / 16, per_row = a.row_bytes / 16;
  uint32_t sum = 0;
  clock_mark(a, 0);
  for (int t = 0; t < a.tiles; ++t) {
#pragma unroll 8
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
      const int row = c / per_row, col = c % per_row;
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(
          a.table + int64_t{random_row(a, t, row)} * a.row_bytes + col * 16));
      sum ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  __syncthreads();
  clock_mark(a, 1);
  if (sum == 0x12345678u) a.sink[threadIdx.x] = sum;  // keeps the loads
}

// Until the phase of `bar` with this parity has completed.
__device__ __forceinline__ void wait_parity(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done)
                 : "r"(smem_u32(bar)), "r"(parity)
                 : "memory");
  }
}

__global__ void gather_bulk(Args a) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[4];
  const int tile_bytes = kTileRows * a.row_bytes;
  if (threadIdx.x < a.stages) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&full[threadIdx.x])));
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
  clock_mark(a, 0);
  // Warp 0 issues: lane l copies rows l and l + 32 of each tile; lane 0 arms the stage's barrier.
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    for (int t = 0; t < a.tiles; ++t) {
      const int s = t % a.stages;
      if (t >= a.stages) {  // the stage's previous tile has landed
        wait_parity(&full[s], ((t / a.stages) - 1) & 1);
      }
      __syncwarp();
      if (lane == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&full[s])),
                     "r"(tile_bytes)
                     : "memory");
      }
      __syncwarp();
      for (int r = lane; r < kTileRows; r += 32) {
        const uint8_t* src = a.table + int64_t{random_row(a, t, r)} * a.row_bytes;
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                smem_u32(smem + s * tile_bytes + r * a.row_bytes)),
            "l"(src), "r"(a.row_bytes), "r"(smem_u32(&full[s]))
            : "memory");
      }
    }
    // Drain: every stage's last tile.
    for (int t = a.tiles > a.stages ? a.tiles - a.stages : 0; t < a.tiles; ++t) {
      const int s = t % a.stages;
      wait_parity(&full[s], (t / a.stages) & 1);
    }
  }
  __syncthreads();
  clock_mark(a, 1);
}

int main(int argc, char** argv) {
  const int row_bytes = argc > 1 ? std::atoi(argv[1]) : 1152;
  const int rows = argc > 2 ? std::atoi(argv[2]) : 8192;
  // "cluster": only 384-thread cp.async at every SM, pairs or not, launched as clusters of 2 CTAs
  // or not (a cluster's CTAs share a GPC): with Nsight Compute, do two SMs that read the same
  // rows at the same time read fewer L2 sectors when they are near each other?
  const bool cluster_runs = argc > 3 && std::string(argv[3]) == "cluster";
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int tiles = 400;
  uint8_t* table;
  unsigned long long* clocks;
  uint32_t* sink;
  CHECK(cudaMalloc(&table, static_cast<size_t>(rows) * row_bytes));
  CHECK(cudaMemset(table, 1, static_cast<size_t>(rows) * row_bytes));
  CHECK(cudaMalloc(&clocks, 4 * sizeof(unsigned long long)));
  CHECK(cudaMalloc(&sink, 1024 * sizeof(uint32_t)));
  uint4* out;
  CHECK(cudaMalloc(&out, static_cast<size_t>(sms) * kTileRows * row_bytes));
  // The most any run asks for (3 stages); the bulk kernel's barriers are static shared memory on top.
  const int smem_need = 3 * kTileRows * row_bytes;
  CHECK(cudaFuncSetAttribute(gather_cpasync, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_need));
  CHECK(cudaFuncSetAttribute(gather_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_need));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::printf("row_bytes %d, table %d rows (%.1f MB), %d tiles of 64 rows per CTA\n", row_bytes, rows,
              rows * double(row_bytes) / 1e6, tiles);
  std::printf("%-8s %7s %6s %6s %5s %5s %12s %9s %10s %12s %8s\n", "mech", "threads", "stages", "write", "pairs", "CTAs",
              "us/tile/CTA", "read TB/s", "read B/cyc", "r+w B/cyc/SM", "SM MHz");
  struct Run {
    const char* name;
    int threads, stages, write_div, pair_shift, cluster;
  };
  const std::vector<Run> all_runs = {{"cpasync", 128, 2, 0, 0, 1},  {"cpasync", 384, 3, 0, 0, 1}, {"cpasync", 384, 3, 0, 1, 1},
                                     {"cpasync", 640, 3, 0, 0, 1},  {"cpasync", 1024, 3, 0, 0, 1}, {"cpasync", 1024, 3, 8, 0, 1},
                                     {"ldg", 1024, 1, 0, 0, 1},      {"ldg", 1024, 1, 0, 1, 1},      {"bulk", 32, 2, 0, 0, 1}};
  const std::vector<Run> cluster_list = {{"cpasync", 384, 3, 0, 0, 1}, {"cpasync", 384, 3, 0, 1, 1},
                                         {"cpasync", 384, 3, 0, 0, 2}, {"cpasync", 384, 3, 0, 1, 2}};
  const std::vector<Run>& runs = cluster_runs ? cluster_list : all_runs;
  for (const Run& r : runs) {
    const int tile_bytes = kTileRows * row_bytes;
    if ((r.name[0] != 'l') && r.stages * tile_bytes > smem_need) continue;
    for (int ctas : {1, 8, 66, sms, 2 * sms}) {  // 2 × SMs: two CTAs an SM where they fit (ldg)
      if (ctas > sms && r.name[0] != 'l') continue;
      if (cluster_runs && ctas != sms) continue;
      Args a{table, rows, row_bytes, tiles, r.stages, r.pair_shift, r.write_div, out, clocks, sink};
      auto launch = [&] {
        const int smem = r.name[0] == 'l' ? 0 : r.stages * tile_bytes;
        if (r.name[0] == 'c' && r.cluster > 1) {
          cudaLaunchConfig_t config = {};
          config.gridDim = dim3(ctas);
          config.blockDim = dim3(r.threads);
          config.dynamicSmemBytes = smem;
          cudaLaunchAttribute cluster;
          cluster.id = cudaLaunchAttributeClusterDimension;
          cluster.val.clusterDim.x = r.cluster;
          cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
          config.attrs = &cluster;
          config.numAttrs = 1;
          CHECK(cudaLaunchKernelEx(&config, gather_cpasync, a));
        } else if (r.name[0] == 'c') {
          gather_cpasync<<<ctas, r.threads, smem>>>(a);
        }
        if (r.name[0] == 'l') gather_ldg<<<ctas, r.threads, smem>>>(a);
        if (r.name[0] == 'b') gather_bulk<<<ctas, r.threads, smem>>>(a);
      };
      launch();  // warm the table into L2
      CHECK(cudaGetLastError());
      float best_ms = 1e30f;
      unsigned long long c[4] = {0, 0, 0, 0}, best_c[4];
      for (int rep = 0; rep < 5; ++rep) {
        CHECK(cudaEventRecord(e0));
        launch();
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        CHECK(cudaMemcpy(c, clocks, sizeof(c), cudaMemcpyDeviceToHost));
        if (ms < best_ms) {
          best_ms = ms;
          for (int k = 0; k < 4; ++k) best_c[k] = c[k];
        }
      }
      const double bytes = double(ctas) * tiles * tile_bytes;
      const double written = r.write_div ? bytes / r.write_div : 0.0;
      const double mhz = double(best_c[1] - best_c[0]) / double(best_c[3] - best_c[2]) * 1e3;
      const double cycles = best_ms * 1e-3 * mhz * 1e6;
      std::printf("%-8s %7d %6d %6s %5s %5d %12.3f %9.2f %10.1f %12.1f %8.0f\n", r.cluster > 1 ? "cpasync2" : r.name, r.threads, r.stages,
                  r.write_div ? (r.write_div == 8 ? "1/8" : "1/4") : "-", r.pair_shift ? "yes" : "-", ctas, best_ms * 1e3 / tiles,
                  bytes / (best_ms * 1e-3) / 1e12, bytes / std::min(ctas, sms) / cycles, (bytes + written) / std::min(ctas, sms) / cycles, mhz);
    }
  }
  return 0;
}
