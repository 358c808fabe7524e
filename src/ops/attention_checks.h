// Argument checks shared by the sparse attention ops' validation (decode, combine, prefill,
// gather). Each throws dsv4::Error "op: arg: expected X, got Y" and reads no output.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "dsv4/kv_layout.h"
#include "dsv4/tensor.h"

namespace dsv4::ops {

// How strictly a tensor must be laid out: fully row-major, or only its last dim dense (rows may
// be strided, e.g. a slice of a larger batch).
enum class Dense : uint8_t { all, last_dim };

// Defined, of dtype `dtype`, shape `shape` (-1: any size), on `device`, laid out per `dense`.
void check_tensor(const char* where, const char* name, const TensorView& t, DType dtype,
                  std::initializer_list<int64_t> shape, Device device, Dense dense = Dense::all);
// An output: check_tensor's checks, then non-negative strides and no two elements at one address
// (outputs are written by many CTAs / threads at once; an overlapping view would race).
void check_output_tensor(const char* where, const char* name, const TensorView& t, DType dtype,
                         std::initializer_list<int64_t> shape, Device device,
                         Dense dense = Dense::all);
// Same, for an optional argument: an undefined view passes.
void check_optional_tensor(const char* where, const char* name, const TensorView& t, DType dtype,
                           std::initializer_list<int64_t> shape, Device device);
// A paged cache: check_kv_cache (geometry, dtype, contiguity, alignment, tensor scale), on
// `device`. Returns the layout's logical dim.
int check_cache(const char* where, const char* name, const KvCacheView& cache, Device device);

// The effective softmax scale: `scale`, or d_qk^-0.5 when 0. Must be finite.
float resolve_softmax_scale(const char* where, float scale, int64_t d_qk);

}  // namespace dsv4::ops
