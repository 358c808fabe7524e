// Tensor-memory-accelerator (TMA) descriptors, built on the host.
//
// The driver's cuTensorMapEncodeTiled is fetched through the runtime (no link against libcuda).
// A map describes a strided bf16 (or byte) tensor; the kernel copies boxes of it into shared memory with
// cp.async.bulk.tensor (ptx.cuh) and 128-byte swizzle, the layout wgmma reads (smem_layout.cuh).
// The swizzle follows the destination address, so a 1-row box written at row r of a 1024-byte
// aligned SW128 tile lands exactly where the tile expects row r: TMA can gather rows one by one
// (verified by the prefill tests) — but 128-byte boxes are slow (the sparse prefill ran 6.5x
// slower than with cp.async, docs/notes/prefill.md v5); use TMA for dense boxes.
// Coordinates outside the tensor (negative or past the end) are filled with zeros and never read.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace dsv4::cuda {

// dims/box innermost first; strides_bytes[i] is the byte stride of dimension i + 1 (rank - 1 of
// them, multiples of 16). box[0] · 2 bytes must be <= 128 (one swizzle span).
CUtensorMap make_tensor_map_bf16_sw128(const char* where, const void* base, int rank, const uint64_t* dims,
                                       const uint64_t* strides_bytes, const uint32_t* box);
// The same for a tensor of bytes (fp8 codes): box[0] <= 128.
CUtensorMap make_tensor_map_u8_sw128(const char* where, const void* base, int rank, const uint64_t* dims,
                                     const uint64_t* strides_bytes, const uint32_t* box);

}  // namespace dsv4::cuda
