// Argument checks shared by the dense CPU ops (on top of the generic ones in dsv4/tensor.h).
// Each throws dsv4::Error "<where>: <name>...: expected X, got Y" and never writes anything.
#pragma once

#include <initializer_list>

#include "ops/backend.h"  // NamedView
#include "dsv4/tensor.h"

namespace dsv4::ops {

// t.dtype is one of `allowed` ("expected bf16 or fp32, got fp8_e4m3").
void check_dtype_in(const char* where, const char* name, const TensorView& t,
                    std::initializer_list<DType> allowed);

// Every stride >= 0 (any layout, e.g. a transposed view).
void check_nonnegative_strides(const char* where, const char* name, const TensorView& t);

// Row-strided layout the CPU kernels accept: last dim contiguous (stride 1), every stride >= 0.
// Leading dims may be padded or sliced (e.g. a column range of a wider matrix).
void check_row_strided(const char* where, const char* name, const TensorView& t);

// An output: row-strided (above) and no two elements at the same address (e.g. no stride-0
// broadcast dim), so every element is written once and the result does not depend on the order.
void check_output_layout(const char* where, const char* name, const TensorView& t);
// The same without the contiguous last dim: strides >= 0 and no two elements at one address (an
// output the kernels write element by element at any stride, e.g. a strided 1-d lens).
void check_distinct_elements(const char* where, const char* name, const TensorView& t);

// An output that may alias an input: either the very same view (data, dtype, strides) — the op
// then works in place — or memory disjoint from it. Partial overlap is rejected.
void check_alias_exact_or_disjoint(const char* where, const char* out_name, const TensorView& out,
                                   const char* in_name, const TensorView& in);

// An output that must not share memory with an input (the op reads the input while writing).
void check_disjoint(const char* where, const char* out_name, const TensorView& out,
                    const char* in_name, const TensorView& in);

// Every output shares no byte with another output or with any input (undefined and empty views
// pass): for ops that read inputs and write outputs concurrently and never work in place.
void check_outputs_disjoint(const char* where, std::initializer_list<NamedView> outputs,
                            std::initializer_list<NamedView> inputs);

// Scales of a quantized activation x [rows, cols]: when x is fp8_e4m3, `scale` must be
// [rows, cols / block] (ue8m0 or fp32, any non-negative strides) with block 64 or 128 — the block
// is returned; for a bf16/fp32 x, `scale` must be undefined and 0 is returned.
int64_t check_activation_scale(const char* where, const char* x_name, const TensorView& x,
                               const char* scale_name, const TensorView& scale);

// Scales of a weight: when w is fp8_e4m3, `scale` must have `expected_shape` (one ue8m0 / fp32
// value per 128 × 128 block); for a bf16/fp32 weight it must be undefined.
void check_weight_scale(const char* where, const char* w_name, const TensorView& w,
                        const char* scale_name, const TensorView& scale,
                        std::initializer_list<int64_t> expected_shape);

// The dequantization scale of an FP8 query (Fp8QueryOutput::q_scale, SparseDecodeArgs::q_scale):
// finite, > 0, and small enough that the largest query, bf16(448 · q_scale), is finite.
void check_fp8_query_scale(const char* where, float q_scale);

// An index tensor (positions, slots): 1-d, int32 or int64, `expected_len` entries.
void check_index_vector(const char* where, const char* name, const TensorView& t,
                        int64_t expected_len);

// cos_sin: fp32 [max_pos, R] with R even and 2 <= R <= head_dim, rows contiguous. Returns R.
int64_t check_rope_table(const char* where, const TensorView& cos_sin, int64_t head_dim);

// The outputs of an activation quantization of a [rows, cols] tensor in blocks of `block` (64 or
// 128, dividing cols): xq fp8_e4m3 [rows, cols] (last dim contiguous, distinct elements) and scale
// ue8m0 / fp32 [rows, cols / block] at any non-negative strides (the CUDA FP8 GEMMs take the
// transpose of a contiguous [cols / block, rows] buffer), each disjoint from the other.
void check_act_quant_outputs(const char* where, const char* xq_name, const TensorView& xq,
                             const char* scale_name, const TensorView& scale, int64_t rows,
                             int64_t cols, int block);

}  // namespace dsv4::ops
