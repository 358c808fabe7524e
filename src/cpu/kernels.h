// The CPU backend's kernels: one per op, with the op's signature (src/ops/op_table.h), called by
// the front doors (src/ops/) after they validated every argument's shape, dtype, device, layout
// and aliasing. A kernel still checks the index VALUES it depends on (where the op documents
// such checks) before it writes anything; the stream is ignored.
#pragma once

#include <cstdint>

#include "cpu/indexer_rows.h"  // indexer_query_rows: indexer_query's step
#include "dsv4/compressor.h"
#include "dsv4/indexer.h"
#include "dsv4/indexing.h"
#include "dsv4/ops.h"

namespace dsv4::cpu {

// ---- dense projections and quantization (linear.cpp, batched_linear.cpp, grouped_wo_a.cpp, quantize_act_fp8.cpp,
// dequantize_fp8_blocks.cpp)
void linear(const TensorView& x, const TensorView& x_scale, const TensorView& w,
            const TensorView& w_scale, const TensorView& y, const TensorView& workspace,
            Stream stream);
void batched_linear(const TensorView& x, const TensorView& w, const TensorView& y,
                    const TensorView& workspace, Stream stream);
void grouped_wo_a(const TensorView& o, const TensorView& o_scale, const TensorView& wo_a,
                  const TensorView& wo_a_scale, const TensorView& z, const TensorView& workspace,
                  Stream stream);
void quantize_act_fp8(const TensorView& x, int block, const TensorView& xq, const TensorView& scale,
                      Stream stream);
void dequantize_fp8_blocks(const TensorView& x, const TensorView& scale, int block_rows,
                           int block_cols, const TensorView& y, Stream stream);

// ---- norms and RoPE (rms_norm.cpp, apply_rope.cpp, inv_rope_fp8_quant.cpp,
// qnorm_rope_kv_insert.cpp)
void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
              Stream stream);
void fused_qkv_rms_norm(const TensorView& q_in, const TensorView& wq, const TensorView& kv_in,
                        const TensorView& wkv, float eps, const TensorView& q_out,
                        const TensorView& kv_out, const TensorView& q_fp8,
                        const TensorView& q_scale, Stream stream);
void residual_add_rms_norm(const TensorView& residual, const TensorView& delta,
                           const TensorView& weight, float eps, const TensorView& y,
                           Stream stream);
void apply_rope(const TensorView& x, const TensorView& positions, const TensorView& cos_sin,
                bool inverse, const TensorView& y, Stream stream);
void inv_rope_fp8_quant(const TensorView& o, const TensorView& positions, const TensorView& cos_sin,
                        int block, const TensorView& o_fp8, const TensorView& o_scale,
                        Stream stream);
void qnorm_rope_kv_insert(const TensorView& q, const TensorView& kv, const TensorView& positions,
                          const TensorView& cos_sin, float eps, const KvCacheView& cache,
                          const TensorView& slot_mapping, const Fp8QueryOutput& fp8_query,
                          Stream stream);

// ---- paged KV caches (kv_quantize.cpp): host utilities
void kv_quantize(const KvCacheView& cache, const TensorView& values, const TensorView& slots,
                 Stream stream);
void kv_dequantize(const KvCacheView& cache, const TensorView& slots, const TensorView& out,
                   Stream stream);

// ---- sparse attention (gather.cpp, sparse_prefill.cpp, sparse_decode.cpp, sparse_combine.cpp)
void dequantize_and_gather(const KvCacheView& cache, const TensorView& block_table,
                           const TensorView& seq_lens, const TensorView& gather_lens,
                           int64_t offset, const TensorView& workspace, Stream stream);
void sparse_prefill(const SparsePrefillArgs& args, Stream stream);
void sparse_decode(const SparseDecodeArgs& args, const DecodeSchedule& schedule,
                   const TensorView& workspace, Stream stream);
void sparse_attention_combine(const TensorView& partial_o, const TensorView& partial_lse,
                              const TensorView& attn_sink, const TensorView& out,
                              const TensorView& lse, Stream stream);

// ---- index planning (indexing.cpp)
void local_to_global_slots(const TensorView& local, const TensorView& token_to_req,
                           const TensorView& block_table, int block_size, const TensorView& global,
                           const TensorView& lens, Stream stream);
void swa_window_indices(const TensorView& positions, const TensorView& token_to_req,
                        const TensorView& block_table, int block_size, int window,
                        const TensorView& indices, const TensorView& lens, Stream stream);
void combine_topk_swa_indices(const TensorView& topk, const TensorView& query_start_loc,
                              const TensorView& seq_lens, const TensorView& gather_lens,
                              int window, int compressed_region, int64_t rows_per_request,
                              int ratio, const TensorView& out, const TensorView& out_lens,
                              Stream stream);

// ---- indexer (indexer.cpp; indexer_query_rows in cpu/indexer_rows.h)
void indexer_scores(const TensorView& q_fp8, const TensorView& q_scale, const TensorView& weights,
                    const TensorView& positions, const TensorView& token_to_req,
                    const IndexerKeyCacheView& keys, const TensorView& key_block_table, int ratio,
                    const TensorView& scores, Stream stream);
void indexer_topk(const TensorView& scores, const TensorView& positions, int ratio,
                  const TensorView& indices, const TensorView& lens, Stream stream,
                  TopkOrder order);
void compressed_prefix_indices(const TensorView& positions, int ratio, const TensorView& indices,
                               const TensorView& lens, Stream stream);

// ---- compressor (compressor_add_ape.cpp, compressor_emit.cpp)
void compressor_add_ape(const CompressorConfig& cfg, const TensorView& ape,
                        const TensorView& positions, const TensorView& score_rows, Stream stream);
void compressor_update_and_emit(const CompressorConfig& cfg, const TensorView& kv_rows,
                                const TensorView& score_rows, const CompressorBatch& batch,
                                const TensorView& norm_weight, const TensorView& cos_sin,
                                const CompressorStateView& state, const CompressorOutputView& out,
                                const TensorView& entries, Stream stream);

// ---- synthetic inputs (synthetic_hidden.cpp)
void synthetic_hidden(const TensorView& req_ids, const TensorView& positions, uint64_t seed,
                      const TensorView& out, Stream stream);

// ---- the V3.2 indexer's rows (sparse_mla_indexer.cpp)
void sparse_mla_indexer_quantize(const TensorView& x, const TensorView& positions,
                                 const TensorView& cos_sin, const TensorView& codes,
                                 const TensorView& scales, const TensorView& weights,
                                 Stream stream);
void sparse_mla_indexer_key_insert(const TensorView& k, const TensorView& norm_weight,
                                   const TensorView& norm_bias, float eps,
                                   const TensorView& positions, const TensorView& cos_sin,
                                   const IndexerKeyCacheView& keys, const TensorView& slot_mapping,
                                   Stream stream);

}  // namespace dsv4::cpu
