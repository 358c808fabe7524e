// DecodeGraphs: the CUDA graphs of one layer's decode steps, one per shape bucket.
//
// A decode-only step is padded to a bucket (1, 2, 4, ... tokens; data-dependent widths rounded
// up to powers of two), so every step of a bucket launches the same kernels with the same
// arguments; only the contents of the step's upload, the input rows and the caches differ. The
// first step of a bucket runs eagerly (its temporaries size the workspace), the second is
// captured, later ones replay. A graph replays fixed addresses — the workspace arena, the upload
// buffer, the RoPE table, the graph's own x/y rows — so all graphs are dropped when any of them
// moves (`memory_generation` changes).
//
// Shared by dsv4::Attention and dsv4::SparseMlaAttention: each plans its step with the bucket's
// rows (rows()), builds the key of everything its launch's shapes depend on, and hands the launch
// to run().
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "dsv4/device_tensor.h"
#include "layer/scratch.h"
#include "layer/step_rows.h"
#include "runtime/device_runtime.h"

namespace dsv4 {

class DecodeGraphs {
 public:
  enum class Action { eager, capture, replay };
  // Decode steps of up to this many tokens run as graphs (buckets 1, 2, 4, ..., 512).
  static constexpr int64_t kMaxTokens = 512;
  // The bucket of a decode step of `tokens` tokens: the next power of two.
  static int64_t bucket(int64_t tokens);
  // The rows a decode step of `tokens` tokens runs over: its bucket, at least one FP8 GEMM row
  // group (kFp8GemmRowMultiple), so the bucket's rows need no further padding.
  static int64_t rows(int64_t tokens);

  // One decode step through the graph of `key`: x's T rows [T, dim] (on the GPU) into the fixed
  // rows (unless the step runs on x and y directly: the same device x and y as the caller's last
  // step, and T == rows — then `key` is extended by their addresses), then what next() says on
  // `stream` — `launch` eagerly over those rows; or captured on the capture stream (the scratch
  // refusing to grow meanwhile: nothing may allocate inside a capture), then launched; or
  // replayed — then the first T rows of y out (copy_rows_out: y on the GPU or the host). `around_graph_launch` (may be empty) runs right
  // before each graph launch with true (a tensor-parallel group's launch barrier: the graph holds
  // its allreduce) and right after it with false (an op timer's replay events).
  void run(const std::vector<int64_t>& key, uint64_t memory_generation, int64_t rows,
           const TensorView& x, const TensorView& y, Scratch& scratch, Stream stream,
           const StepLaunch& launch, const std::function<void(bool before)>& around_graph_launch = {});

  // A graph's key: the step's shape key and, for a step on the caller's rows, their addresses
  // (nullptr: the fixed rows).
  struct Key {
    std::vector<int64_t> shape;
    const void* x = nullptr;
    const void* y = nullptr;
  };
  // The same, over a shape key the caller holds (a lookup copies nothing).
  struct KeyRef {
    const std::vector<int64_t>* shape;
    const void* x;
    const void* y;
  };
  struct KeyLess {
    using is_transparent = void;
    template <class A, class B>
    bool operator()(const A& a, const B& b) const {
      return std::tie(shape_of(a), a.x, a.y) < std::tie(shape_of(b), b.x, b.y);
    }
    static const std::vector<int64_t>& shape_of(const Key& k) { return k.shape; }
    static const std::vector<int64_t>& shape_of(const KeyRef& k) { return *k.shape; }
  };
  // What to do with a step of `key` (see above), and its graph when that is to replay it.
  std::pair<Action, const rt::Graph*> next(const KeyRef& key, uint64_t memory_generation);
  const rt::Graph& store(const KeyRef& key, rt::Graph graph);
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
  std::map<Key, rt::Graph, KeyLess> graphs_;
  std::set<Key, KeyLess> seen_;
  uint64_t generation_ = 0;
  std::unique_ptr<rt::OwnedStream> capture_stream_;
  DeviceTensor x_, y_;
  uint64_t io_generation_ = 0;
  const void* last_x_ = nullptr;  // the caller's x and y of the last step (direct steps)
  const void* last_y_ = nullptr;
  int64_t captures_ = 0, replays_ = 0;
};

}  // namespace dsv4
