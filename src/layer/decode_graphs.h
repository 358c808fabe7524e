// DecodeGraphs: the CUDA graphs of one layer's decode steps, one per shape bucket.
//
// A decode-only step is padded to a bucket (1, 2, 4, ... tokens; data-dependent widths rounded
// up to powers of two), so every step of a bucket launches the same kernels with the same
// arguments; only the contents of the step's upload, the input rows and the caches differ. The
// first step of a bucket runs eagerly (its temporaries size the workspace), the second is
// captured, later ones replay. A graph replays fixed addresses — the workspace arena, the upload
// buffer, the RoPE table, the graph's own x/y rows — so all graphs are dropped when any of them
// moves (`memory_generation` changes).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "dsv4/device_tensor.h"
#include "runtime/device_runtime.h"

namespace dsv4 {

class DecodeGraphs {
 public:
  enum class Action { eager, capture, replay };
  // The bucket of a decode step of `tokens` tokens: the next power of two.
  static int64_t bucket(int64_t tokens);

  // What to do with a step of shape `key` (see above).
  Action next(const std::vector<int64_t>& key, uint64_t memory_generation);
  const rt::Graph& graph(const std::vector<int64_t>& key) const { return graphs_.at(key); }
  void store(const std::vector<int64_t>& key, rt::Graph graph);
  // The stream captures run on (created on first use).
  Stream capture_stream();
  // Fixed x [rows, dim] bf16 / y [rows, dim] fp32 rows the graphs read and write (grown, with
  // generation change, when a larger bucket comes).
  void ensure_io(int64_t rows, int64_t dim);
  TensorView x(int64_t rows) const { return x_.view().slice0(0, rows); }
  TensorView y(int64_t rows) const { return y_.view().slice0(0, rows); }
  uint64_t io_generation() const { return io_generation_; }

  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }
  void clear();

 private:
  std::map<std::vector<int64_t>, rt::Graph> graphs_;
  std::set<std::vector<int64_t>> seen_;
  uint64_t generation_ = 0;
  std::unique_ptr<rt::OwnedStream> capture_stream_;
  DeviceTensor x_, y_;
  uint64_t io_generation_ = 0;
  int64_t captures_ = 0, replays_ = 0;
};

}  // namespace dsv4
