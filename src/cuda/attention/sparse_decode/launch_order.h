// The order in which the sparse decode kernel's CTAs take query rows when the batches' lengths
// differ (topk_length given): longest first, so the last wave of CTAs gets the shortest rows.
// That is list scheduling's longest-processing-time-first order, which brings a wave's makespan
// to within a few percent of the balanced ideal; taking rows by index left FlashMLA's CONFIG3 /
// CONFIG4 shapes (extra_topk_length uniform in [0, 1024]) at 1.4–1.6× / 1.2–1.3× it in a host
// simulation (docs/notes/decode.md). Host and device: the CPU tests check the order itself.
#pragma once

#include "dsv4/dtype.h"  // DSV4_HD

namespace dsv4::cuda::decode {

// Every CTA ranks all batches itself (no workspace, no extra launch), so the order is used up to
// this many batches; past it the many waves of CTAs even the load out on their own.
inline constexpr int kMaxOrderedBatches = 256;

// Launch rank of batch i among n with compact lengths `len`: the longer batches, plus the equally
// long ones before it (ties by index, so every CTA computes the same order). A permutation of
// 0..n-1.
DSV4_HD int launch_rank(const int* len, int n, int i) {
  int rank = 0;
  for (int j = 0; j < n; ++j) rank += len[j] > len[i] || (len[j] == len[i] && j < i);
  return rank;
}

}  // namespace dsv4::cuda::decode
