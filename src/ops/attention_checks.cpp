#include "ops/attention_checks.h"

#include <string>

#include "math/softmax_scale.h"
#include "ops/validate.h"
#include "dsv4/status.h"

namespace dsv4::ops {

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
  // (The name is formatted only for the error: this runs on every accepted call.)
  if (cache.data.device != device) check_device(where, detail::concat(name, ".data").c_str(), cache.data, device);
  return kv_geometry(cache.layout, cache.block_size).dim;
}

float resolve_softmax_scale(const char* where, float scale, int64_t d_qk) {
  if (!math::is_valid_softmax_scale(scale)) fail_expected(where, "softmax_scale", math::kSoftmaxScaleRule, scale);
  return math::effective_softmax_scale(scale, d_qk);
}

}  // namespace dsv4::ops
