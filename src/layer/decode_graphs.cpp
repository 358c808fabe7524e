#include "layer/decode_graphs.h"

#include <algorithm>

namespace dsv4 {

int64_t DecodeGraphs::bucket(int64_t tokens) {
  int64_t b = 1;
  while (b < tokens) b *= 2;
  return b;
}

int64_t DecodeGraphs::rows(int64_t tokens) { return std::max(kFp8GemmRowMultiple, bucket(tokens)); }

void DecodeGraphs::run(const std::vector<int64_t>& key, uint64_t memory_generation, int64_t rows,
                       const TensorView& x, const TensorView& y, Scratch& scratch, Stream stream,
                       const StepLaunch& launch, const std::function<void(bool before)>& around_graph_launch) {
  // A caller that hands in the same device x and y as its last step, filling the bucket (T ==
  // rows: nothing to pad), gets graphs that run on them directly, keyed by their addresses: no
  // copy in or out. Addresses that change from step to step keep the fixed rows (and one graph).
  const bool direct = x.size(0) == rows && y.device == Device::cuda && x.data == last_x_ && y.data == last_y_;
  last_x_ = x.data;
  last_y_ = y.data;
  if (!direct) {
    // Sized for the largest bucket at once: growing later would move the rows every graph reads.
    ensure_io(kMaxTokens, x.size(1));
    copy_rows_in(x, this->x(rows), stream);
  }
  const KeyRef ref{&key, direct ? x.data : nullptr, direct ? y.data : nullptr};
  const TensorView x_rows = direct ? x : this->x(rows);
  const TensorView y_rows = direct ? y : this->y(rows);
  const auto launch_graph = [&](const rt::Graph& g) {
    if (around_graph_launch) around_graph_launch(true);
    g.launch(stream);
    if (around_graph_launch) around_graph_launch(false);
  };
  const auto [action, replayed] = next(ref, memory_generation);
  switch (action) {
    case Action::eager:
      launch(x_rows, y_rows, stream);
      break;
    case Action::capture: {
      const Stream cs = capture_stream();
      scratch.set_capturing(true);
      rt::Graph captured;
      try {
        captured = rt::Graph::capture(cs, [&] { launch(x_rows, y_rows, cs); });
      } catch (...) {
        scratch.set_capturing(false);
        throw;
      }
      scratch.set_capturing(false);
      launch_graph(store(ref, std::move(captured)));
      break;
    }
    case Action::replay:
      launch_graph(*replayed);
      break;
  }
  if (!direct) copy_rows_out(this->y(rows), y, scratch, stream);
}

std::pair<DecodeGraphs::Action, const rt::Graph*> DecodeGraphs::next(const KeyRef& key,
                                                                     uint64_t memory_generation) {
  if (memory_generation + io_generation_ != generation_) {
    graphs_.clear();  // something they replay moved; `seen_` stays (the workspace is sized)
    generation_ = memory_generation + io_generation_;
  }
  if (const auto it = graphs_.find(key); it != graphs_.end()) {
    ++replays_;
    return {Action::replay, &it->second};
  }
  if (seen_.insert(Key{*key.shape, key.x, key.y}).second) return {Action::eager, nullptr};
  return {Action::capture, nullptr};
}

const rt::Graph& DecodeGraphs::store(const KeyRef& key, rt::Graph graph) {
  ++captures_;
  return graphs_.insert_or_assign(Key{*key.shape, key.x, key.y}, std::move(graph)).first->second;
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
