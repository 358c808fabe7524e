// compressor_project (docs/spec.md §4 (a)): kv_rows = x·wkvᵀ, score_rows = x·wgateᵀ + ape[p mod r]. The
// front door: validation, then the sequence — two dsv4::linear projections and the backend's ape
// bias.
#include <utility>

#include "cpu/rows.h"
#include "dsv4/compressor.h"
#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

void compressor_project(const CompressorConfig& cfg, const TensorView& x, const TensorView& wkv,
                        const TensorView& wgate, const TensorView& ape, const TensorView& positions,
                        const TensorView& kv_rows, const TensorView& score_rows, Stream stream) {
  compressor_project(cfg, x, wkv, wgate, ape, positions, kv_rows, score_rows, TensorView{}, stream);
}

void compressor_project(const CompressorConfig& cfg, const TensorView& x, const TensorView& wkv,
                        const TensorView& wgate, const TensorView& ape, const TensorView& positions,
                        const TensorView& kv_rows, const TensorView& score_rows,
                        const TensorView& workspace, Stream stream) {
  constexpr const char* kOp = "compressor_project";
  cfg.validate(kOp);
  const int64_t width = cfg.proj_width();
  check_defined(kOp, "x", x);
  check_ndim(kOp, "x", x, 2);
  const int64_t T = x.size(0), dim = x.size(1);
  ops::check_dtype_in(kOp, "x", x, {DType::bf16, DType::fp32});
  ops::check_row_strided(kOp, "x", x);
  for (const auto& [name, w] : {std::pair<const char*, const TensorView&>{"wkv", wkv},
                                std::pair<const char*, const TensorView&>{"wgate", wgate}}) {
    check_defined(kOp, name, w);
    ops::check_dtype_in(kOp, name, w, {DType::bf16, DType::fp32});
    check_shape(kOp, name, w, {width, dim});
    ops::check_row_strided(kOp, name, w);
  }
  check_defined(kOp, "ape", ape);
  check_dtype(kOp, "ape", ape, DType::fp32);
  check_shape(kOp, "ape", ape, {cfg.ratio, width});
  ops::check_row_strided(kOp, "ape", ape);
  ops::check_index_vector(kOp, "positions", positions, T);
  for (const auto& [name, out] :
       {std::pair<const char*, const TensorView&>{"kv_rows", kv_rows},
        std::pair<const char*, const TensorView&>{"score_rows", score_rows}}) {
    check_defined(kOp, name, out);
    check_dtype(kOp, name, out, DType::fp32);
    check_shape(kOp, name, out, {T, width});
    ops::check_output_layout(kOp, name, out);
  }
  ops::check_outputs_disjoint(kOp, {{"kv_rows", kv_rows}, {"score_rows", score_rows}},
                              {{"x", x}, {"wkv", wkv}, {"wgate", wgate}, {"ape", ape},
                               {"positions", positions}});
  const Device dev = ops::common_device(kOp, {{"x", x},
                                              {"wkv", wkv},
                                              {"wgate", wgate},
                                              {"ape", ape},
                                              {"positions", positions},
                                              {"kv_rows", kv_rows},
                                              {"score_rows", score_rows}});
  if (dev == Device::cpu) {
    // Host data: positions index ape (checked before the projections write).
    for (int64_t t = 0; t < T; ++t)
      if (cpu::load_index(positions, t) < 0)
        fail_expected(kOp, detail::concat("positions[", t, "]"), ">= 0",
                      cpu::load_index(positions, t));
  } else {
    // The CUDA linear (cuBLASLt) multiplies x and a weight of one dtype: bf16 · bf16 or
    // fp32 · fp32 (fp32 out). Checked for both weights before the first GEMM writes anything.
    for (const auto& [name, w] : {std::pair<const char*, const TensorView&>{"wkv", wkv},
                                  std::pair<const char*, const TensorView&>{"wgate", wgate}})
      if (w.dtype != x.dtype)
        fail_expected(kOp, detail::concat(name, ".dtype"),
                      detail::concat(dtype_name(x.dtype),
                                     " (the dtype of x: on CUDA x and the weights share one dtype)"),
                      dtype_name(w.dtype));
    // ... and rows that do not overlap (linear's CUDA rule), checked here for all five operands
    // so that the second GEMM cannot reject what the first accepted.
    for (const auto& [name, m] : {std::pair<const char*, const TensorView&>{"x", x},
                                  std::pair<const char*, const TensorView&>{"wkv", wkv},
                                  std::pair<const char*, const TensorView&>{"wgate", wgate},
                                  std::pair<const char*, const TensorView&>{"kv_rows", kv_rows},
                                  std::pair<const char*, const TensorView&>{"score_rows", score_rows}})
      if (m.size(0) > 1 && m.stride(0) < m.size(1))
        fail_expected(kOp, detail::concat(name, ".stride(0)"),
                      detail::concat(">= ", m.size(1), " on CUDA (rows must not overlap)"),
                      m.stride(0));
    // positions are not read on the host: a negative one turns its score row into NaN there.
  }

  // The two projections (dsv4::linear on the same backend), then the backend's ape bias (looked
  // up first: a backend without it fails before anything is written).
  ops::CompressorAddApeFn* const add_ape = ops::kernel(kOp, ops::kCompressorProject, dev);
  // One workspace serves both: the two GEMMs run one after the other on `stream`.
  linear(x, {}, wkv, {}, kv_rows, workspace, stream);
  linear(x, {}, wgate, {}, score_rows, workspace, stream);
  add_ape(cfg, ape, positions, score_rows, stream);
}

}  // namespace dsv4
