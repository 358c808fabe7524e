// PostedCopy: host bytes that reach a device buffer without a CUDA call at the time they are sent.
//
// A replayed decode step must put its plan (positions, slots, changed block-table rows: a few KB)
// on the device before its kernels read it. An asynchronous copy costs the host three runtime
// calls per step — the copy, an event recording it, a wait for the staging's previous copy —
// which measured 5–11 µs on the lent H200 hosts, a tenth of a decode graph's whole GPU time. Here
// the host instead writes the bytes into page-locked memory and fills in a "post" (where the
// bytes are, which range); the step's first kernel, part of the replayed graph, reads the post
// and copies the range into the device buffer, then writes back the number of the post it took.
//
// Flow control: one post is outstanding at a time. post() waits (spinning on the number the
// device wrote back) until the device took the previous one, so the staging and the post are never
// rewritten while a kernel still reads them. That lets the host run at most one step ahead of the
// start of the GPU's last step; a host that plans while the GPU runs the step before does not
// wait. While it waits it asks the stream from time to time: a stream that failed, or that went
// idle without taking the post, throws dsv4::Error instead of spinning forever.
//
// A post must be taken exactly once: after post(), the caller enqueues take() (or replays a graph
// that captured it) and then calls taken_enqueued(). A post whose take was never confirmed (its
// forward threw in between) is settled by the next post(), which then synchronizes the stream.
//
// Implemented in src/cuda/runtime/posted_copy.cu (the take kernel); without CUDA
// (posted_copy_none.cpp) constructing one throws dsv4::Error.
#pragma once

#include <cstdint>
#include <memory>

#include "dsv4/ops.h"  // Stream

namespace dsv4::rt {

class PostedCopy {
 public:
  PostedCopy();
  ~PostedCopy();
  PostedCopy(const PostedCopy&) = delete;
  PostedCopy& operator=(const PostedCopy&) = delete;

  // Makes the staging hold `bytes` (outside any capture: it may allocate page-locked memory, after
  // waiting until the device took the outstanding post). Returns whether the staging moved: a
  // captured take reads the staging at its old address, so such graphs must be captured again.
  bool reserve(int64_t bytes, Stream stream);
  int64_t capacity() const;
  // Posts bytes [lo, hi) of `src` to land at the same offsets of the take's destination. lo and hi
  // must be multiples of kAlign, hi <= capacity(), and src must hold [lo, hi). Waits as described
  // above; makes no CUDA call unless it must wait.
  void post(const uint8_t* src, int64_t lo, int64_t hi, Stream stream);
  // Enqueues on `stream` the kernel that copies the current post into `dst` (which must hold every
  // range posted) and reports it taken. Capturable: a graph that captured it takes, at each replay,
  // the post of that moment (from the staging as it was at the capture: see reserve()).
  void take(uint8_t* dst, Stream stream);
  // The take of the last post was enqueued or launched (a graph holding it replayed).
  void taken_enqueued();
  // Posts the device has taken.
  uint64_t taken() const;

  static constexpr int64_t kAlign = 16;  // the take copies 16-byte words

 private:
  struct State;
  void wait_taken(uint64_t seq, Stream stream);
  void settle(Stream stream);  // a post whose take was never confirmed: synchronize, then count
  std::unique_ptr<State> s_;
};

}  // namespace dsv4::rt
