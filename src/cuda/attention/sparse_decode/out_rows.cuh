// The sparse decode kernel's way out for O (kernel.cuh): each consumer warpgroup's half of the
// CTA's 64 output rows, the bf16 output or this split's fp32 partial, staged in shared memory and
// stored in whole lines, or in a cluster stored straight from the accumulators.
#pragma once

#include <cstdint>

#include "cuda/attention/sparse_decode/config.h"
#include "cuda/attention/sparse_decode/work.cuh"
#include "cuda/common/attention_tile.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/wgmma.cuh"

namespace dsv4::cuda::decode::detail {

// This thread's accumulator pair j of row acc_row(2r) (columns acc_col(0) + 8j, + 1), times factor[r].
template <class Frag>
__device__ __forceinline__ float2 scaled_o_pair(const Frag& rO, const float (&factor)[2], int r, int j) {
  return make_float2(rO(4 * j + 2 * r) * factor[r], rO(4 * j + 2 * r + 1) * factor[r]);
}

// This thread's part of a warpgroup's O half (256 columns), times factor[r] for rows acc_row(2r),
// into `rows` (64 rows of kOutRowPitch<T> bytes): fp32, or rounded to bf16 (T = uint16_t).
template <class T, class Frag>
__device__ __forceinline__ void stage_o_rows(const Frag& rO, const float (&factor)[2], uint8_t* rows, int tid) {
  const int col0 = acc_col(0, tid);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    T* const row = reinterpret_cast<T*>(rows + acc_row(2 * r, tid) * kOutRowPitch<T>) + col0;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const float2 pair = scaled_o_pair(rO, factor, r, j);
      if constexpr (sizeof(T) == 4) {
        *reinterpret_cast<float2*>(row + 8 * j) = pair;
      } else {
        *reinterpret_cast<uint32_t*>(row + 8 * j) = pack_bf16x2(pair.x, pair.y);
      }
    }
  }
}

// A warpgroup's staged O rows (those of heads below `valid_rows`) to global memory, row i at
// dst(i), in 16-byte pieces: a warp's store covers 512 contiguous bytes of one row, four whole
// 128-byte lines.
template <class T, class Dst>
__device__ __forceinline__ void copy_out_rows(const uint8_t* rows, int valid_rows, int tid, Dst&& dst) {
  constexpr int kChunksPerRow = kDv / 2 * static_cast<int>(sizeof(T)) / 16;
  constexpr int kChunks = kHeadsPerCta * kChunksPerRow;
  static_assert(kChunks % 128 == 0 && kChunksPerRow % 32 == 0, "whole warps per row");
#pragma unroll 8
  for (int c = tid; c < kChunks; c += 128) {
    const int i = c / kChunksPerRow, k = c - i * kChunksPerRow;
    if (i < valid_rows)
      reinterpret_cast<uint4*>(dst(i))[k] = *reinterpret_cast<const uint4*>(rows + i * kOutRowPitch<T> + 16 * k);
  }
}

// The same rows stored from the accumulators straight to global memory: the bf16 output in
// 16-byte chunks through a quad transpose (a warp store covers 64 bytes of 8 rows), the fp32
// partial in 8-byte pairs (32 bytes of 8 rows).
template <int kHalf, class Frag>
__device__ __forceinline__ void store_o_rows_direct(const DecodeParams& p, const CtaWork& w, const Frag& rO,
                                                    const float (&factor)[2], int tid) {
  if (p.num_splits == 1) {
    uint16_t* out_row = p.out + p.out_strides.row_offset(w.batch, w.seq) + kHalf * (kDv / 2);
    for_each_o_chunk(rO, factor, tid, [&](int r, int col, uint4 chunk) {
      const int h = w.head_block * kHeadsPerCta + acc_row(2 * r, tid);
      if (h >= p.num_heads) return;
      *reinterpret_cast<uint4*>(out_row + static_cast<int64_t>(h) * p.out_strides.h + col) = chunk;
    });
    return;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = w.head_block * kHeadsPerCta + acc_row(2 * r, tid);
    if (h >= p.num_heads) continue;
    const int64_t out_row = static_cast<int64_t>(w.row) * p.num_heads + h;
    const int col0 = kHalf * (kDv / 2) + acc_col(0, tid);
    float* dst = p.partial_o + (out_row * p.num_splits + w.split) * kDv + col0;
#pragma unroll
    for (int j = 0; j < 32; ++j) *reinterpret_cast<float2*>(dst + j * 8) = scaled_o_pair(rO, factor, r, j);
  }
}

// This warpgroup's O half (value dims 256·kHalf ..), times factor[r] for rows acc_row(2r): the
// bf16 output (one split) or the fp32 partial of this split.
//
// Without a cluster the rows go through shared memory (SharedPlan::out_rows, kOutRowPitch),
// where the warps regroup them into whole lines of one row (copy_out_rows). Stored straight from
// the accumulators, a split CTA of V4-Flash b2 spent some 5600 of its 17400 cycles issuing its
// 128 KB of partials, a warp store's 8 rows of 32 bytes each its own request (H200 trace,
// docs/notes/decode.md). A cluster CTA stores them directly: its stages may still be read by its
// copies of its rows to the peer until the peer's consumers are past the last tile, and waiting
// for that made V4-Pro b1 (H 128, splits) 7 % slower.
template <KvLayout L, int kCluster, int kHalf, class Frag>
__device__ __forceinline__ void store_o_half(const DecodeParams& p, const CtaWork& w, SharedPlan<L>& plan,
                                             const Frag& rO, const float (&factor)[2]) {
  const int tid = threadIdx.x % 128;
  if constexpr (kCluster == 2) {
    store_o_rows_direct<kHalf>(p, w, rO, factor, tid);
  } else {
    const bool partial = p.num_splits > 1;
    uint8_t* const rows = plan.out_rows() + kHalf * kOutHalfBytes<float>;
    if (partial) {
      stage_o_rows<float>(rO, factor, rows, tid);
    } else {
      stage_o_rows<uint16_t>(rO, factor, rows, tid);
    }
    ptx::named_barrier_sync(kBarOutRows + kHalf, 128);
    const int valid_rows = p.num_heads - w.head_block * kHeadsPerCta;
    if (partial) {
      const int64_t first_row = static_cast<int64_t>(w.row) * p.num_heads + w.head_block * kHeadsPerCta;
      copy_out_rows<float>(rows, valid_rows, tid, [&](int i) {
        return p.partial_o + ((first_row + i) * p.num_splits + w.split) * kDv + kHalf * (kDv / 2);
      });
    } else {
      uint16_t* const out_row = p.out + p.out_strides.row_offset(w.batch, w.seq) + kHalf * (kDv / 2);
      copy_out_rows<uint16_t>(rows, valid_rows, tid, [&](int i) {
        return out_row + static_cast<int64_t>(w.head_block * kHeadsPerCta + i) * p.out_strides.h;
      });
    }
  }
}

}  // namespace dsv4::cuda::decode::detail
