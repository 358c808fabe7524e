#include "cpu/attention_checks.h"

#include <cmath>
#include <string>

#include "cpu/validate.h"
#include "dsv4/status.h"

namespace dsv4::cpu {

void check_tensor(const char* where, const char* name, const TensorView& t, DType dtype,
                  std::initializer_list<int64_t> shape, Device device, Dense dense) {
  check_defined(where, name, t);
  check_dtype(where, name, t, dtype);
  check_shape(where, name, t, shape);
  check_device(where, name, t, device);
  if (dense == Dense::all)
    check_contiguous(where, name, t);
  else
    check_inner_contiguous(where, name, t);
}

void check_output_tensor(const char* where, const char* name, const TensorView& t, DType dtype,
                         std::initializer_list<int64_t> shape, Device device, Dense dense) {
  check_tensor(where, name, t, dtype, shape, device, dense);
  check_output_layout(where, name, t);
}

void check_optional_tensor(const char* where, const char* name, const TensorView& t, DType dtype,
                           std::initializer_list<int64_t> shape, Device device) {
  if (t.defined()) check_tensor(where, name, t, dtype, shape, device);
}

int check_cache(const char* where, const char* name, const KvCacheView& cache, Device device) {
  check_kv_cache(where, name, cache);  // geometry, dtype, contiguity, alignment, tensor scale
  check_device(where, detail::concat(name, ".data").c_str(), cache.data, device);
  return kv_geometry(cache.layout, cache.block_size).dim;
}

void check_values_in_range(const char* where, const char* name, const int32_t* v, int64_t n,
                           int64_t lo, int64_t hi) {
  for (int64_t i = 0; i < n; ++i)
    if (v[i] < lo || v[i] > hi)
      fail_expected(where, detail::concat(name, "[", i, "]"),
                    detail::concat("a value in [", lo, ", ", hi, "]"), v[i]);
}

float resolve_softmax_scale(const char* where, float scale, int64_t d_qk) {
  if (!std::isfinite(scale)) fail_expected(where, "softmax_scale", "a finite value", scale);
  return scale != 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(d_qk)));
}

}  // namespace dsv4::cpu
