#include "layer/decode_graphs.h"

namespace dsv4 {

int64_t DecodeGraphs::bucket(int64_t tokens) {
  int64_t b = 1;
  while (b < tokens) b *= 2;
  return b;
}

DecodeGraphs::Action DecodeGraphs::next(const std::vector<int64_t>& key,
                                        uint64_t memory_generation) {
  if (memory_generation + io_generation_ != generation_) {
    graphs_.clear();  // something they replay moved; `seen_` stays (the workspace is sized)
    generation_ = memory_generation + io_generation_;
  }
  if (graphs_.count(key)) {
    ++replays_;
    return Action::replay;
  }
  if (seen_.insert(key).second) return Action::eager;
  return Action::capture;
}

void DecodeGraphs::store(const std::vector<int64_t>& key, rt::Graph graph) {
  graphs_[key] = std::move(graph);
  ++captures_;
}

Stream DecodeGraphs::capture_stream() {
  if (!capture_stream_) capture_stream_ = std::make_unique<rt::OwnedStream>();
  return capture_stream_->get();
}

void DecodeGraphs::ensure_io(int64_t rows, int64_t dim) {
  if (x_.numel() >= rows * dim) return;
  x_ = DeviceTensor(DType::bf16, {rows, dim});
  y_ = DeviceTensor(DType::fp32, {rows, dim});
  // Padding rows are read by row-wise kernels whose results nobody uses; zeros keep them finite.
  x_.fill_bytes(0);
  ++io_generation_;
}

void DecodeGraphs::clear() {
  graphs_.clear();
  seen_.clear();
}

}  // namespace dsv4
