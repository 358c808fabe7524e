// BranchStream: a stream of our own that independent work forks onto from another stream and
// joins back from, by events — in a capture, a parallel branch of the graph. The layer runs work
// of a step that does not depend on its other work this way (docs/design.md, "Independent work of
// a step runs side by side").
#pragma once

#include <memory>

#include "runtime/device_runtime.h"

namespace dsv4::rt {

class BranchStream {
 public:
  // The branch, after it waits (on the device) for the work enqueued on `parent` so far. The
  // stream is created on first use (OwnedStream: legal inside a capture).
  Stream fork(Stream parent) {
    if (!stream_) stream_ = std::make_unique<OwnedStream>();
    fork_.record(parent);
    fork_.make_wait(stream_->get());
    return stream_->get();
  }
  // The branch's stream (after fork()).
  Stream get() const { return stream_->get(); }
  // Makes `other` wait (on the device) for the work enqueued on the branch so far.
  void join_into(Stream other) {
    join_.record(stream_->get());
    join_.make_wait(other);
  }

 private:
  std::unique_ptr<OwnedStream> stream_;
  Event fork_, join_;
};

}  // namespace dsv4::rt
