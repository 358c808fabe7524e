// The sparse prefill kernel's trace points (kernel_trace.cuh; a -DDSV4_KERNEL_TRACE build only,
// otherwise every point is an empty statement and the kernel's code does not change).
//
// Traced: CTAs 0 and 1 (the first token's two head groups at H 128). A row is a CTA tile number g
// (tiles counted across items), so a row follows one buffer fill from its gather to its release.
// Thread 0 of the role named records, in the serial schedule (TraceEvent):
//   the producer:          0 before the k_empty wait, 1 past it (and past an O store from the
//                          buffer), 2 with both halves' gathers issued;
//   the tile's owner WG:   3 before its k_full waits, 4 past them (S issued next), 5 S done,
//                          6 P and the row stats published, 7 its own P·V done (buffer released);
//   the other WG:          8 before its p_ready wait, 9 past it, 10 its P·V done (released);
//   on an item's last tile: 11 WG0's epilogue start, 13 WG1's, 14 WG0 past the row-sum exchange,
//                          16 WG0's output factors ready, 17 its O stores issued (before the
//                          proxy fence), 12 WG0 done staging O;
//   WG0, on an item's first tile: 15 past its q_full wait.
// In the pair schedule (PairTraceEvent; tile 2j + w of an item's pair j lies in buffer w):
//   the producer, per column half h of the tile's buffer: 3h before the k_empty wait, 3h + 1 past
//                          it, 3h + 2 its copies issued;
//   the tile's owner WG:   6 before its first half's k_full wait, 7 past it (S starts), 8 past the
//                          second half's (its second piece's), 9 S done, 10 its reference max
//                          published, 11 past the wait for the other WG's max, 12 its P published,
//                          13 its own P·V done;
//   the other WG:          14 past the wait for the tile's P, 15 its P·V on it done;
//   WG0, on an item's last tile: 16 its epilogue start, 17 its O stored; on an item's first
//                          tile: 18 past its q_full wait;
//   and the producer marks the trace as the pair's (kTracePairMarker in the once-per-CTA row).
// bench/trace/prefill_trace_summary.py reads either.
#pragma once

#include <cstdint>

#include "cuda/common/kernel_trace.cuh"

namespace dsv4::cuda::sparse_prefill_detail {

enum TraceEvent : int {
  kTraceEmptyWait = 0,
  kTraceEmptyDone = 1,
  kTraceGatherIssued = 2,
  kTraceFullWait = 3,
  kTraceFullDone = 4,
  kTraceSDone = 5,
  kTracePublished = 6,
  kTraceOwnPvDone = 7,
  kTraceRemoteWait = 8,
  kTraceRemoteSeen = 9,
  kTraceRemotePvDone = 10,
  kTraceEpilogueStart = 11,
  kTraceOStaged = 12,
  kTraceEpilogueStartWg1 = 13,
  kTraceRowSumsExchanged = 14,
  kTraceQSeen = 15,
  kTraceFactors = 16,
  kTraceOStores = 17,
};

enum PairTraceEvent : int {
  kPairEmptyWaitHalf0 = 0,  // + 3 for half 1
  kPairEmptyDoneHalf0 = 1,
  kPairIssuedHalf0 = 2,
  kPairFullWaitFirst = 6,
  kPairFullDoneFirst = 7,
  kPairFullDoneSecond = 8,
  kPairSDone = 9,
  kPairMaxPublished = 10,
  kPairOtherMaxSeen = 11,
  kPairPPublished = 12,
  kPairOwnPvDone = 13,
  kPairRemotePSeen = 14,
  kPairRemotePvDone = 15,
  kPairEpilogueStart = 16,
  kPairOStored = 17,
  kPairQSeen = 18,
  kTracePairMarker = 19,  // once per CTA: this trace is the pair schedule's
};

// Thread `tid` (of its warpgroup) records `event` of CTA tile `g`; only thread 0 of each role.
template <class Event>
__device__ __forceinline__ void trace_tile_event([[maybe_unused]] int tid, [[maybe_unused]] uint32_t g,
                                                 [[maybe_unused]] Event event) {
#if defined(DSV4_KERNEL_TRACE)
  if (tid == 0 && blockIdx.x < trace::kCtas && g < static_cast<uint32_t>(trace::kOnceRow))
    DSV4_TRACE(static_cast<int>(blockIdx.x), static_cast<int>(g), static_cast<int>(event));
#endif
}

// The pair schedule's mark in the once-per-CTA row (thread 0 of the producer).
__device__ __forceinline__ void trace_pair_marker([[maybe_unused]] int tid) {
#if defined(DSV4_KERNEL_TRACE)
  if (tid == 0 && blockIdx.x < trace::kCtas)
    DSV4_TRACE(static_cast<int>(blockIdx.x), trace::kOnceRow, kTracePairMarker);
#endif
}

}  // namespace dsv4::cuda::sparse_prefill_detail
