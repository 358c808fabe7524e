// The fuzzed ops: for each public op of include/dsv4/ that takes views, a generator of valid
// cases (small random shapes, dtypes, strides and index values the op must accept) and the call
// through the public API. The generic mutations (mutate.h) turn valid cases into hostile ones.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "dsv4/kv_layout.h"
#include "fuzz_case.h"

namespace dsv4::fuzz {

// What the ops see: the case's views and scalars by name.
class Bound {
 public:
  Bound(const Case& c, const Materialized& m) : c_(c), m_(m) {}
  // The view of argument `name`; undefined when the case has no such argument or it is undefined.
  TensorView t(const std::string& name) const;
  int64_t i(const std::string& name) const { return c_.i(name); }
  float f(const std::string& name) const { return c_.f(name); }
  // The paged cache `name` (its bytes plus the scalars name.layout, name.block_size,
  // name.tensor_scale; see add_kv_cache).
  KvCacheView kv(const std::string& name) const;

 private:
  const Case& c_;
  const Materialized& m_;
};

// A cheap property of an accepted call's results did not hold.
struct SanityFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct OpSpec {
  std::string name;
  Case (*make)(Rng& rng);             // a valid case
  void (*call)(const Bound& b);       // the op, on the CPU or CUDA by where the views live
};

// Every fuzzed op, in a fixed order (a seed replays the same cases).
const std::vector<OpSpec>& op_table();

// Per-area registration (one file each).
void add_dense_ops(std::vector<OpSpec>& ops);
void add_attention_ops(std::vector<OpSpec>& ops);
void add_indexing_ops(std::vector<OpSpec>& ops);
void add_compressor_indexer_ops(std::vector<OpSpec>& ops);
void add_sparse_mla_ops(std::vector<OpSpec>& ops);

// ---- helpers for the generators ---------------------------------------------------------------
int64_t draw(Rng& rng, int64_t lo, int64_t hi);  // uniform in [lo, hi]
bool coin(Rng& rng);
template <typename T>
T draw_of(Rng& rng, std::initializer_list<T> v) {
  return *(v.begin() + draw(rng, 0, static_cast<int64_t>(v.size()) - 1));
}
// A real-valued argument (uniform in [-2, 2]).
Arg real(std::string name, DType t, std::vector<int64_t> shape, Role role = Role::input);
// An output (poisoned before the call).
Arg output(std::string name, DType t, std::vector<int64_t> shape);
// Index-valued: uniform integers in [lo, hi], or a fixed list.
Arg ints(std::string name, DType t, std::vector<int64_t> shape, int64_t lo, int64_t hi);
Arg list(std::string name, DType t, std::vector<int64_t> shape, std::vector<int64_t> values);
// Raw random bytes (caches, workspaces).
Arg bytes(std::string name, std::vector<int64_t> shape, Role role = Role::input);
// `n` distinct values drawn from [0, range) (n <= range), each replaced by -1 with probability
// 1/8 when `holes`.
std::vector<int64_t> distinct(Rng& rng, int64_t n, int64_t range, bool holes = false);
// A paged KV cache argument `name` of num_blocks blocks and its scalars.
void add_kv_cache(Case& c, const std::string& name, KvLayout layout, int block_size,
                  int64_t num_blocks, Role role);
KvLayout any_layout(Rng& rng);
// A RoPE table cos_sin fp32 [max_pos, rope_dims] (values do not matter to validation).
Arg rope_table(int64_t max_pos, int64_t rope_dims = 64);

}  // namespace dsv4::fuzz
