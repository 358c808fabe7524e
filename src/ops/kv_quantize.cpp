// kv_quantize / kv_dequantize (docs/spec.md §7): the bulk host quantize and dequantize of a KV cache's
// tokens at given slots. The front doors: validation, then the backend (the CPU only: both are
// host utilities, their slots live in host memory).
#include "dsv4/kv_layout.h"
#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

namespace {

// Rows [n, dim] fp32/bf16 in host memory, last dim contiguous.
void check_rows(const char* where, const char* name, const TensorView& t, int64_t dim) {
  check_defined(where, name, t);
  check_device(where, name, t, Device::cpu);
  ops::check_dtype_in(where, name, t, {DType::fp32, DType::bf16});
  check_ndim(where, name, t, 2);
  check_dim(where, name, t, 1, dim);
  ops::check_row_strided(where, name, t);
}

// The slot tensor's layout: a host index vector [n] (its values are checked by the kernel).
void check_slot_tensor(const char* where, const TensorView& slots, int64_t n) {
  ops::check_index_vector(where, "slots", slots, n);
  check_device(where, "slots", slots, Device::cpu);
}

}  // namespace

void kv_quantize(const KvCacheView& cache, const TensorView& values, const TensorView& slots) {
  constexpr const char* where = "kv_quantize";
  check_kv_cache(where, "cache", cache);
  check_device(where, "cache.data", cache.data, Device::cpu);
  check_rows(where, "values", values, kv_geometry(cache.layout, cache.block_size).dim);
  check_slot_tensor(where, slots, values.shape[0]);
  // The cache is written while values and slots are read: a slot or value living inside the
  // cache would change under the loop.
  ops::check_outputs_disjoint(where, {{"cache.data", cache.data}},
                              {{"values", values}, {"slots", slots}});
  ops::kernel(where, ops::kKvQuantize, Device::cpu)(cache, values, slots, nullptr);
}

void kv_dequantize(const KvCacheView& cache, const TensorView& slots, const TensorView& out) {
  constexpr const char* where = "kv_dequantize";
  check_kv_cache(where, "cache", cache);
  check_device(where, "cache.data", cache.data, Device::cpu);
  check_rows(where, "out", out, kv_geometry(cache.layout, cache.block_size).dim);
  ops::check_output_layout(where, "out", out);  // rows written concurrently: no shared element
  check_slot_tensor(where, slots, out.shape[0]);
  ops::check_outputs_disjoint(where, {{"out", out}}, {{"cache.data", cache.data}, {"slots", slots}});
  ops::kernel(where, ops::kKvDequantize, Device::cpu)(cache, slots, out, nullptr);
}

}  // namespace dsv4
