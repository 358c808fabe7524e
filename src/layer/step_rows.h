// StepRows: the token rows a layer step's kernels run over, and how x and y cross them — shared by
// dsv4::Attention and dsv4::SparseMlaAttention.
//
// A step's launch may run over more rows than the plan has tokens: on CUDA the FP8 GEMMs take row
// counts that are multiples of kFp8GemmRowMultiple, and a decode step bucketed for CUDA graphs runs
// over its whole bucket (DecodeGraphs::rows). The extra rows read zero (or, in a graph's fixed
// rows, an earlier step's) input rows and their outputs are dropped: every kernel treats rows
// independently, so they never reach a real token's row.
#pragma once

#include <cstdint>
#include <functional>

#include "dsv4/ops.h"
#include "dsv4/tensor.h"
#include "layer/scratch.h"

namespace dsv4 {

// A step's kernels, enqueued over x [rows, dim] and y [rows, dim] fp32 on `stream` (the layer's,
// or a graph capture's).
using StepLaunch = std::function<void(const TensorView& x, const TensorView& y, Stream stream)>;

// The rows a step of `tokens` tokens launches over. CPU: `tokens`. CUDA: a bucketed decode step's
// DecodeGraphs::rows, any other step's tokens rounded up to a multiple of kFp8GemmRowMultiple.
int64_t step_rows(Device device, int64_t tokens, bool bucketed);

// Copies x's rows [T, dim] into the first T rows of x_rows (both on the GPU), on `stream`.
void copy_rows_in(const TensorView& x, const TensorView& x_rows, Stream stream);
// Delivers the first T rows of y_rows (on the layer's device) to y [T, dim]: a copy on `stream`
// when y is on that device, else a download to the host y (which waits for the stream).
void copy_rows_out(const TensorView& y_rows, const TensorView& y, Scratch& scratch, Stream stream);

// Runs `launch` eagerly, over `rows` rows: over x and y themselves when rows == T and y is on the
// layer's device; else over rows of `scratch` — x's T rows, then zero rows, in; the first T rows
// of y out (copy_rows_out).
void run_eager_step(int64_t rows, const TensorView& x, const TensorView& y, Scratch& scratch,
                    Stream stream, const StepLaunch& launch);

}  // namespace dsv4
