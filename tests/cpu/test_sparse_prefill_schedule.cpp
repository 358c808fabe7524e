// The sparse prefill's automatic schedule choice (src/cuda/attention/sparse_prefill.h,
// sparse_prefill_auto_schedule), host only: the pair for two or more head groups; for one group
// the pair only when the kv fits in the L2 and items hold 16 tiles or more, or are all full (no
// topk_length) with an even count of 8 or more; the serial schedule otherwise — at each boundary
// of the rule, on both sides. (The GPU tests run every case under
// both schedules, so neither path goes untested whatever this picks.)
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/attention/sparse_prefill.h"

namespace {

using dsv4::cuda::sparse_prefill_auto_schedule;
using dsv4::cuda::SparsePrefillSchedule;

constexpr int64_t kL2 = 50 * 1024 * 1024;  // an H100 SXM's L2
// A kv of s_kv rows of d_qk bf16.
constexpr int64_t kv_bytes(int64_t s_kv, int64_t d_qk) { return s_kv * d_qk * 2; }

TEST(SparsePrefillSchedule, TwoOrMoreHeadGroupsTakeThePairWhateverTheShape) {
  for (int64_t heads : {65, 128, 192}) {
    for (int64_t topk : {64, 512, 2048}) {
      for (int64_t s_kv : {int64_t{8192}, int64_t{131072}}) {
        EXPECT_EQ(sparse_prefill_auto_schedule(heads, topk, false, kv_bytes(s_kv, 576), kL2), SparsePrefillSchedule::kPair)
            << "H " << heads << " topk " << topk << " s_kv " << s_kv;
      }
    }
  }
}

TEST(SparsePrefillSchedule, OneGroupTakesThePairForLongItemsOfAKvInL2) {
  // V3.2's shape at H 64 (a tensor-parallel rank), s_kv 8k and 32k: 9.4 MB and 37.7 MB of kv.
  for (int64_t heads : {1, 16, 64}) {
    EXPECT_EQ(sparse_prefill_auto_schedule(heads, 2048, false, kv_bytes(8192, 576), kL2), SparsePrefillSchedule::kPair);
    EXPECT_EQ(sparse_prefill_auto_schedule(heads, 2048, false, kv_bytes(32768, 576), kL2), SparsePrefillSchedule::kPair);
    EXPECT_EQ(sparse_prefill_auto_schedule(heads, 1024, false, kv_bytes(8192, 512), kL2), SparsePrefillSchedule::kPair);
  }
}

TEST(SparsePrefillSchedule, OneGroupStaysSerialForShortItemsOrAKvPastL2) {
  // V4-Flash (top-k 512: 8 tiles an item) at any s_kv.
  EXPECT_EQ(sparse_prefill_auto_schedule(64, 512, false, kv_bytes(8192, 512), kL2), SparsePrefillSchedule::kSerial);
  EXPECT_EQ(sparse_prefill_auto_schedule(64, 512, false, kv_bytes(65536, 512), kL2), SparsePrefillSchedule::kSerial);
  // V3.2's shape at H 64 and s_kv 64k: 75.5 MB of kv.
  EXPECT_EQ(sparse_prefill_auto_schedule(64, 2048, false, kv_bytes(65536, 576), kL2), SparsePrefillSchedule::kSerial);
}

TEST(SparsePrefillSchedule, OneGroupTakesThePairForFullEvenItemsOfAKvInL2) {
  // V4-Flash (top-k 512: 8 tiles an item) without topk_length, at s_kv 8k (8 MB of kv) and 64k.
  EXPECT_EQ(sparse_prefill_auto_schedule(64, 512, true, kv_bytes(8192, 512), kL2), SparsePrefillSchedule::kPair);
  EXPECT_EQ(sparse_prefill_auto_schedule(64, 512, true, kv_bytes(65536, 512), kL2), SparsePrefillSchedule::kSerial);
  // Shorter full items, and an odd count (the last pair a half one), stay serial.
  EXPECT_EQ(sparse_prefill_auto_schedule(64, 448, true, kv_bytes(8192, 512), kL2), SparsePrefillSchedule::kSerial);
  EXPECT_EQ(sparse_prefill_auto_schedule(64, 576, true, kv_bytes(8192, 512), kL2), SparsePrefillSchedule::kSerial);
  EXPECT_EQ(sparse_prefill_auto_schedule(64, 640, true, kv_bytes(8192, 512), kL2), SparsePrefillSchedule::kPair);
  // A partial last tile counts as a tile: 513 slots are 9 tiles.
  EXPECT_EQ(sparse_prefill_auto_schedule(64, 513, true, kv_bytes(8192, 512), kL2), SparsePrefillSchedule::kSerial);
  // With topk_length the same shape stays serial.
  EXPECT_EQ(sparse_prefill_auto_schedule(64, 512, false, kv_bytes(8192, 512), kL2), SparsePrefillSchedule::kSerial);
}

TEST(SparsePrefillSchedule, BoundariesAreInclusiveOnThePairsSide) {
  EXPECT_EQ(sparse_prefill_auto_schedule(64, 1024, false, kL2, kL2), SparsePrefillSchedule::kPair);
  EXPECT_EQ(sparse_prefill_auto_schedule(64, 960, false, kL2, kL2), SparsePrefillSchedule::kSerial);
  EXPECT_EQ(sparse_prefill_auto_schedule(64, 961, false, kL2, kL2), SparsePrefillSchedule::kPair);  // 16 tiles, the last partial
  EXPECT_EQ(sparse_prefill_auto_schedule(64, 1024, false, kL2 + 1, kL2), SparsePrefillSchedule::kSerial);
  EXPECT_EQ(sparse_prefill_auto_schedule(64, 4096, false, 0, kL2), SparsePrefillSchedule::kPair);
  // A device that reports no L2 gets the serial schedule for one group.
  EXPECT_EQ(sparse_prefill_auto_schedule(64, 2048, false, kv_bytes(8192, 576), 0), SparsePrefillSchedule::kSerial);
}

}  // namespace
