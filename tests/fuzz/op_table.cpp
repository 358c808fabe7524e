#include "op_table.h"

#include <algorithm>
#include <numeric>

namespace dsv4::fuzz {

TensorView Bound::t(const std::string& name) const {
  return c_.index_of(name) < 0 ? TensorView{} : m_.view(name);
}

KvCacheView Bound::kv(const std::string& name) const {
  KvCacheView v;
  v.data = t(name);
  // Through the underlying type: a mutated layout number stays a defined conversion.
  v.layout = static_cast<KvLayout>(static_cast<uint8_t>(i(name + ".layout")));
  v.block_size = static_cast<int>(i(name + ".block_size"));
  v.tensor_scale = f(name + ".tensor_scale");
  return v;
}

const std::vector<OpSpec>& op_table() {
  static const std::vector<OpSpec> table = [] {
    std::vector<OpSpec> ops;
    add_dense_ops(ops);
    add_attention_ops(ops);
    add_indexing_ops(ops);
    add_compressor_indexer_ops(ops);
    add_sparse_mla_ops(ops);
    return ops;
  }();
  return table;
}

int64_t draw(Rng& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

bool coin(Rng& rng) { return draw(rng, 0, 1) == 1; }

Arg real(std::string name, DType t, std::vector<int64_t> shape, Role role) {
  Arg a;
  a.name = std::move(name);
  a.dtype = t;
  a.shape = std::move(shape);
  a.role = role;
  return a;
}

Arg output(std::string name, DType t, std::vector<int64_t> shape) {
  return real(std::move(name), t, std::move(shape), Role::output);
}

Arg ints(std::string name, DType t, std::vector<int64_t> shape, int64_t lo, int64_t hi) {
  Arg a = real(std::move(name), t, std::move(shape));
  a.index = true;
  a.values = {Values::Kind::ints, lo, hi, {}};
  return a;
}

Arg list(std::string name, DType t, std::vector<int64_t> shape, std::vector<int64_t> values) {
  Arg a = real(std::move(name), t, std::move(shape));
  a.index = true;
  if (values.empty()) values.push_back(0);  // an empty tensor: nothing is read
  a.values = {Values::Kind::list, 0, 0, std::move(values)};
  return a;
}

Arg bytes(std::string name, std::vector<int64_t> shape, Role role) {
  Arg a = real(std::move(name), DType::uint8, std::move(shape), role);
  a.values.kind = Values::Kind::bytes;
  return a;
}

std::vector<int64_t> distinct(Rng& rng, int64_t n, int64_t range, bool holes) {
  std::vector<int64_t> all(static_cast<size_t>(range));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<size_t>(n));
  if (holes)
    for (int64_t& v : all)
      if (draw(rng, 0, 7) == 0) v = -1;
  return all;
}

void add_kv_cache(Case& c, const std::string& name, KvLayout layout, int block_size,
                  int64_t num_blocks, Role role) {
  const KvGeometry g = kv_geometry(layout, block_size);
  c.args.push_back(bytes(name, {num_blocks, g.block_bytes}, role));
  c.scalars.push_back({name + ".layout", static_cast<double>(layout), true});
  c.scalars.push_back({name + ".block_size", static_cast<double>(block_size), true});
  c.scalars.push_back({name + ".tensor_scale", layout == KvLayout::fp8_per_tensor ? 0.5 : 1.0, false});
}

KvLayout any_layout(Rng& rng) {
  return draw_of(rng, {KvLayout::model1_fp8, KvLayout::v32_fp8, KvLayout::bf16,
                       KvLayout::fp8_per_tensor});
}

Arg rope_table(int64_t max_pos, int64_t rope_dims) {
  return real("cos_sin", DType::fp32, {max_pos, rope_dims});
}

}  // namespace dsv4::fuzz
