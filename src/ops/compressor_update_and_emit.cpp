// compressor_update_and_emit (docs/spec.md §4 (b)): the front door — shapes, dtypes, devices and
// aliasing checked once — then the backend (src/cpu/compressor_emit.cpp, src/cuda/compressor/).
#include <utility>

#include "dsv4/compressor.h"
#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

namespace {

constexpr const char* kEmitOp = "compressor_update_and_emit";

void check_block_table(const char* name, const TensorView& table, int64_t rows, int64_t min_cols) {
  check_defined(kEmitOp, name, table);
  check_dtype(kEmitOp, name, table, DType::int32);
  check_ndim(kEmitOp, name, table, 2);
  check_dim(kEmitOp, name, table, 0, rows);
  if (table.size(1) < min_cols)
    fail_expected(kEmitOp, detail::concat(name, ".shape[1]"), detail::concat(">= ", min_cols),
                  table.size(1));
}

void check_output(const CompressorConfig& cfg, const CompressorOutputView& out, int64_t R) {
  check_block_table("out.block_table", out.block_table, R, 0);
  if (cfg.target == CompressorTarget::kv_cache) {
    check_kv_cache(kEmitOp, "out.kv_cache", out.kv_cache);
    const KvLayout l = out.kv_cache.layout;
    if (l != KvLayout::model1_fp8 && l != KvLayout::bf16 && l != KvLayout::fp8_per_tensor)
      fail_expected(kEmitOp, "out.kv_cache.layout", "MODEL1_FP8, BF16 or FP8_PER_TENSOR (dim 512)",
                    kv_layout_name(l));
    if (l == KvLayout::fp8_per_tensor && !(out.kv_cache.tensor_scale > 0.0f))
      fail_expected(kEmitOp, "out.kv_cache.tensor_scale", "> 0", out.kv_cache.tensor_scale);
  } else {
    check_indexer_key_cache(kEmitOp, "out.indexer_keys", out.indexer_keys);
  }
}

}  // namespace

void compressor_update_and_emit(const CompressorConfig& cfg, const TensorView& kv_rows,
                                const TensorView& score_rows, const CompressorBatch& batch,
                                const TensorView& norm_weight, const TensorView& cos_sin,
                                const CompressorStateView& state, const CompressorOutputView& out,
                                const TensorView& entries, Stream stream) {
  cfg.validate(kEmitOp);
  const int D = cfg.head_dim, K = cfg.ring_rows();
  const int64_t width = cfg.proj_width();

  // ---- shapes, dtypes, devices ----
  check_defined(kEmitOp, "positions", batch.positions);
  check_ndim(kEmitOp, "positions", batch.positions, 1);
  const int64_t T = batch.positions.size(0);
  ops::check_index_vector(kEmitOp, "positions", batch.positions, T);
  ops::check_index_vector(kEmitOp, "token_to_req", batch.token_to_req, T);
  check_defined(kEmitOp, "context_lens", batch.context_lens);
  check_ndim(kEmitOp, "context_lens", batch.context_lens, 1);
  const int64_t R = batch.context_lens.size(0);
  ops::check_index_vector(kEmitOp, "context_lens", batch.context_lens, R);
  for (const auto& [name, rows] :
       {std::pair<const char*, const TensorView&>{"kv_rows", kv_rows},
        std::pair<const char*, const TensorView&>{"score_rows", score_rows}}) {
    check_defined(kEmitOp, name, rows);
    check_dtype(kEmitOp, name, rows, DType::fp32);
    check_shape(kEmitOp, name, rows, {T, width});
    ops::check_row_strided(kEmitOp, name, rows);
  }
  check_defined(kEmitOp, "norm_weight", norm_weight);
  ops::check_dtype_in(kEmitOp, "norm_weight", norm_weight, {DType::bf16, DType::fp32});
  check_shape(kEmitOp, "norm_weight", norm_weight, {D});
  ops::check_row_strided(kEmitOp, "norm_weight", norm_weight);
  check_defined(kEmitOp, "cos_sin", cos_sin);
  check_dtype(kEmitOp, "cos_sin", cos_sin, DType::fp32);
  check_ndim(kEmitOp, "cos_sin", cos_sin, 2);
  check_dim(kEmitOp, "cos_sin", cos_sin, 1, cfg.rope_dims);
  ops::check_row_strided(kEmitOp, "cos_sin", cos_sin);
  check_defined(kEmitOp, "state.rows", state.rows);
  check_dtype(kEmitOp, "state.rows", state.rows, DType::fp32);
  check_ndim(kEmitOp, "state.rows", state.rows, 2);
  check_dim(kEmitOp, "state.rows", state.rows, 1, cfg.state_width());
  ops::check_row_strided(kEmitOp, "state.rows", state.rows);
  if (state.block_size < 1) fail_expected(kEmitOp, "state.block_size", ">= 1", state.block_size);
  check_block_table("state.block_table", state.block_table, R,
                    (int64_t{K} + state.block_size - 1) / state.block_size);  // no int overflow
  check_output(cfg, out, R);
  if (entries.defined()) {
    check_dtype(kEmitOp, "entries", entries, DType::fp32);
    check_shape(kEmitOp, "entries", entries, {T, D});
    ops::check_output_layout(kEmitOp, "entries", entries);
  }
  const TensorView& out_data =
      cfg.target == CompressorTarget::kv_cache ? out.kv_cache.data : out.indexer_keys.data;
  // Written: the ring (read-modify-write of its own rows), the output cache and entries.
  ops::check_outputs_disjoint(
      kEmitOp, {{"state.rows", state.rows}, {"out cache", out_data}, {"entries", entries}},
      {{"kv_rows", kv_rows}, {"score_rows", score_rows}, {"positions", batch.positions},
       {"token_to_req", batch.token_to_req}, {"context_lens", batch.context_lens},
       {"norm_weight", norm_weight}, {"cos_sin", cos_sin},
       {"state.block_table", state.block_table}, {"out.block_table", out.block_table}});
  const Device dev = ops::common_device(kEmitOp, {{"kv_rows", kv_rows},
                                                  {"score_rows", score_rows},
                                                  {"positions", batch.positions},
                                                  {"token_to_req", batch.token_to_req},
                                                  {"context_lens", batch.context_lens},
                                                  {"norm_weight", norm_weight},
                                                  {"cos_sin", cos_sin},
                                                  {"state.rows", state.rows},
                                                  {"state.block_table", state.block_table},
                                                  {"out.block_table", out.block_table},
                                                  {"out cache", out_data},
                                                  {"entries", entries}});
  // The CPU kernel checks the index data (runs, slots) before writing; on CUDA the host never
  // reads index tensors and the kernels skip what the CPU would reject (header comment).
  ops::kernel(kEmitOp, ops::kCompressorUpdateAndEmit, dev)(cfg, kv_rows, score_rows, batch,
                                                          norm_weight, cos_sin, state, out,
                                                          entries, stream);
}

}  // namespace dsv4
