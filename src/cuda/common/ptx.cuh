// Thin, documented wrappers over the Hopper PTX the attention kernels need and CuTe does not
// expose in a form we want: mbarriers, cp.async gathers that complete on an mbarrier, named
// barriers between warpgroups, async-proxy fences and register reallocation.
//
// Device-only; every function is a single instruction (or a short wait loop) so kernels read as
// their algorithm. Shared-memory addresses are 32-bit `.shared::cta` addresses (smem_addr()).
#pragma once

#include <cstdint>

namespace dsv4::cuda::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---------------------------------------------------------------- mbarrier
// A 64-bit shared-memory barrier with a phase bit. `init` sets the number of arrivals per phase.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrivals));
}
// Makes mbarrier.init visible to the other threads and to the async proxy (before __syncthreads).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// One arrival (release semantics: this thread's earlier shared-memory writes are visible to a
// thread that observes the phase flip).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile(
      "{\n\t.reg .b64 st;\n\tmbarrier.arrive.shared::cta.b64 st, [%0];\n\t}" ::"r"(smem_addr(bar))
      : "memory");
}
// Blocks until the phase with parity `phase` has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t phase) {
  asm volatile(
      "{\n\t.reg .pred done;\n"
      "WAIT_%=:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
      "@!done bra WAIT_%=;\n\t}" ::"r"(smem_addr(bar)),
      "r"(phase)
      : "memory");
}

// ---------------------------------------------------------------- cp.async gathers
// 16-byte global→shared copy through L2 only (.cg), hinting L2 to fetch the surrounding 256 B
// (gathered rows are ≥ 1 KB contiguous). When `valid` is false nothing is read and the 16
// destination bytes are zero-filled, so masked rows never touch memory (src may be any address).
__device__ __forceinline__ void cp_async_16_zfill(void* smem_dst, const void* gmem_src, bool valid) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(smem_addr(smem_dst)),
               "l"(gmem_src), "r"(valid ? 16 : 0)
               : "memory");
}
// The same copy, always reading its 16 bytes.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(smem_addr(smem_dst)), "l"(gmem_src)
               : "memory");
}
// 4-byte variant through L1 (.ca: cp.async takes .cg only for 16 bytes), for rows that are only
// 4-byte aligned; `valid` false zero-fills without a read, as above.
__device__ __forceinline__ void cp_async_4_zfill(void* smem_dst, const void* gmem_src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(smem_dst)), "l"(gmem_src),
               "r"(valid ? 4 : 0)
               : "memory");
}
// The barrier receives one arrival when every cp.async this thread issued so far has landed
// (.noinc: the arrival counts against the count given at mbarrier_init).
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar))
               : "memory");
}

// ---------------------------------------------------------------- TMA (bulk tensor copies)
// One arrival that also announces `bytes` more to come from bulk copies completing on `bar`.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
// Copies the box at coordinates (c0 innermost, c1[, c2]) of the tensor map (a __grid_constant__
// kernel parameter) to shared memory; its bytes complete on `bar`.
__device__ __forceinline__ void tma_load_2d(void* smem_dst, const void* tensor_map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(smem_addr(smem_dst)), "l"(tensor_map), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(void* smem_dst, const void* tensor_map, int c0, int c1, int c2,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];" ::"r"(smem_addr(smem_dst)),
      "l"(tensor_map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}
// An L2 cache policy that marks the lines a copy brings in (or writes) first to be evicted: for
// streams read or written once, so they do not push out data that is read again.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// tma_load_3d with an L2 cache policy (l2_evict_first_policy) on the lines it reads.
__device__ __forceinline__ void tma_load_3d(void* smem_dst, const void* tensor_map, int c0, int c1, int c2,
                                            uint64_t* bar, uint64_t l2_policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(smem_addr(smem_dst)),
      "l"(tensor_map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar)), "l"(l2_policy)
      : "memory");
}

// Bulk tensor store: the box at (c0, c1, c2) of the tensor map from shared memory. Boxes past the
// tensor's end are clipped. Asynchronous: bulk_commit() closes a group, bulk_wait_read<N>() waits
// until at most N groups still read shared memory, bulk_wait<N>() until their writes are done.
// Generic-proxy writes of the source must be fenced (fence_proxy_async_smem) and published first.
// `l2_policy` (e.g. l2_evict_first_policy) is the L2 cache policy of the lines it writes.
__device__ __forceinline__ void tma_store_3d(const void* tensor_map, const void* smem_src, int c0, int c1, int c2,
                                             uint64_t l2_policy) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%2, %3, %4}], [%1], %5;"
               ::"l"(tensor_map), "r"(smem_addr(smem_src)), "r"(c0), "r"(c1), "r"(c2), "l"(l2_policy)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kPending) : "memory");
}

// ---------------------------------------------------------------- named barriers
// Hardware barriers 1..15 between a subset of warps (0 is __syncthreads). `threads` counts every
// participant (multiple of 32). arrive() does not wait: a producer signals, a consumer syncs.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---------------------------------------------------------------- read-only gathers
// 16 read-only bytes whose L2 miss fetches the 256-byte span around them (one DRAM burst for a
// gathered row's neighbouring chunks), kept in L1 only as a last resort. Not volatile: the
// compiler may schedule it like any load.
__device__ __forceinline__ uint4 ld_nc_l2_256(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::evict_last.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
// The same, or zeros without a read when !valid: one predicated load, no branch around it.
// Volatile, so it stays where it is written (between the stores it is interleaved with).
__device__ __forceinline__ uint4 ld_nc_l2_256_or_zero(const void* p, bool valid) {
  uint4 v;
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %5, 0;\n\t"
      "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
      "@p ld.global.nc.L1::evict_last.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
      : "=&r"(v.x), "=&r"(v.y), "=&r"(v.z), "=&r"(v.w)
      : "l"(p), "r"(static_cast<int>(valid)));
  return v;
}
// 8 read-only bytes, or zeros without a read when !valid (predicated, as above).
__device__ __forceinline__ uint2 ld_nc_v2_or_zero(const void* p, bool valid) {
  uint2 v;
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %3, 0;\n\tmov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\t"
      "@p ld.global.nc.v2.u32 {%0, %1}, [%2];\n\t}"
      : "=&r"(v.x), "=&r"(v.y)
      : "l"(p), "r"(static_cast<int>(valid)));
  return v;
}

// ---------------------------------------------------------------- proxies and registers
// `v`, as a value the compiler cannot see through: what is computed from it inside a loop stays
// inside the loop (keeps loop-invariant address arithmetic from occupying registers).
__device__ __forceinline__ int opaque(int v) {
  int out;
  asm volatile("mov.b32 %0, %1;" : "=r"(out) : "r"(v));
  return out;
}

// Ordinary shared-memory stores that wgmma / TMA read next must be fenced into the async proxy
// by the writing thread before the barrier that publishes them.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// setmaxnreg: move registers between warpgroups (needs __launch_bounds__(threads, 1)); each
// warpgroup role must be one branch of an if/else around the whole role.
template <uint32_t kRegs>
__device__ __forceinline__ void warpgroup_regs_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void warpgroup_regs_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

}  // namespace dsv4::cuda::ptx
