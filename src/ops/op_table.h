// The public ops that have backends, as typed keys: each key names the op and fixes the signature
// every backend's kernel of it has (the public op's fullest overload, stream included). The front
// doors (src/ops/*.cpp) look a kernel up by key; the backends' rows (src/ops/backends/*.cpp)
// register kernels by key, so a kernel with the wrong signature does not compile.
#pragma once

#include <cstdint>

#include "dsv4/compressor.h"
#include "dsv4/indexer.h"
#include "dsv4/indexing.h"
#include "dsv4/indexer_key_cache.h"
#include "dsv4/ops.h"
#include "dsv4/tensor.h"

namespace dsv4::ops {

enum class OpId : uint8_t {
  linear,
  batched_linear,
  grouped_wo_a,
  quantize_act_fp8,
  dequantize_fp8_blocks,
  rms_norm,
  fused_qkv_rms_norm,
  residual_add_rms_norm,
  apply_rope,
  inv_rope_fp8_quant,
  qnorm_rope_kv_insert,
  kv_quantize,
  kv_dequantize,
  dequantize_and_gather,
  sparse_prefill,
  sparse_decode,
  sparse_attention_combine,
  local_to_global_slots,
  swa_window_indices,
  combine_topk_swa_indices,
  indexer_query,
  indexer_scores,
  indexer_topk,
  compressed_prefix_indices,
  compressor_project,
  compressor_update_and_emit,
  synthetic_hidden,
  sparse_mla_indexer_quantize,
  sparse_mla_indexer_key_insert,
  count,
};
inline constexpr int kNumOps = static_cast<int>(OpId::count);

// The op's public name ("rms_norm"): what errors, `dsv4 info --ops` and the Python registry say.
const char* op_name(OpId op);

template <class Fn>
struct OpKey {
  OpId id;
};

using LinearFn = void(const TensorView& x, const TensorView& x_scale, const TensorView& w,
                      const TensorView& w_scale, const TensorView& y, const TensorView& workspace,
                      Stream stream);
using BatchedLinearFn = void(const TensorView& x, const TensorView& w, const TensorView& y,
                             const TensorView& workspace, Stream stream);
using GroupedWoAFn = void(const TensorView& o, const TensorView& o_scale, const TensorView& wo_a,
                          const TensorView& wo_a_scale, const TensorView& z,
                          const TensorView& workspace, Stream stream);
using QuantizeActFp8Fn = void(const TensorView& x, int block, const TensorView& xq,
                              const TensorView& scale, Stream stream);
using DequantizeFp8BlocksFn = void(const TensorView& x, const TensorView& scale, int block_rows,
                                   int block_cols, const TensorView& y, Stream stream);
using RmsNormFn = void(const TensorView& x, const TensorView& weight, float eps,
                       const TensorView& y, Stream stream);
using FusedQkvRmsNormFn = void(const TensorView& q_in, const TensorView& wq,
                               const TensorView& kv_in, const TensorView& wkv, float eps,
                               const TensorView& q_out, const TensorView& kv_out,
                               const TensorView& q_fp8, const TensorView& q_scale, Stream stream);
using ResidualAddRmsNormFn = void(const TensorView& residual, const TensorView& delta,
                                  const TensorView& weight, float eps, const TensorView& y,
                                  Stream stream);
using ApplyRopeFn = void(const TensorView& x, const TensorView& positions,
                         const TensorView& cos_sin, bool inverse, const TensorView& y,
                         Stream stream);
using InvRopeFp8QuantFn = void(const TensorView& o, const TensorView& positions,
                               const TensorView& cos_sin, int block, const TensorView& o_fp8,
                               const TensorView& o_scale, Stream stream);
using QnormRopeKvInsertFn = void(const TensorView& q, const TensorView& kv,
                                 const TensorView& positions, const TensorView& cos_sin, float eps,
                                 const KvCacheView& cache, const TensorView& slot_mapping,
                                 const Fp8QueryOutput& fp8_query, Stream stream);
using KvQuantizeFn = void(const KvCacheView& cache, const TensorView& values,
                          const TensorView& slots, Stream stream);
using KvDequantizeFn = void(const KvCacheView& cache, const TensorView& slots,
                            const TensorView& out, Stream stream);
using DequantizeAndGatherFn = void(const KvCacheView& cache, const TensorView& block_table,
                                   const TensorView& seq_lens, const TensorView& gather_lens,
                                   int64_t offset, const TensorView& workspace, Stream stream);
using SparsePrefillFn = void(const SparsePrefillArgs& args, Stream stream);
using SparseDecodeFn = void(const SparseDecodeArgs& args, const DecodeSchedule& schedule,
                            const TensorView& workspace, Stream stream);
using SparseAttentionCombineFn = void(const TensorView& partial_o, const TensorView& partial_lse,
                                      const TensorView& attn_sink, const TensorView& out,
                                      const TensorView& lse, Stream stream);
using LocalToGlobalSlotsFn = void(const TensorView& local, const TensorView& token_to_req,
                                  const TensorView& block_table, int block_size,
                                  const TensorView& global, const TensorView& lens, Stream stream);
using SwaWindowIndicesFn = void(const TensorView& positions, const TensorView& token_to_req,
                                const TensorView& block_table, int block_size, int window,
                                const TensorView& indices, const TensorView& lens, Stream stream);
using CombineTopkSwaIndicesFn = void(const TensorView& topk, const TensorView& query_start_loc,
                                     const TensorView& seq_lens, const TensorView& gather_lens,
                                     int window, int compressed_region, int64_t rows_per_request,
                                     int ratio, const TensorView& out, const TensorView& out_lens,
                                     Stream stream);
// Composite ops run a sequence in their front door (src/ops): their backend kernel is the step
// after the dsv4::linear projections. indexer_query's: RoPE, Hadamard and FP8 of the projected
// q [T, H·128] fp32, and the weights' scale.
using IndexerQueryRowsFn = void(const TensorView& q_proj, const TensorView& positions,
                                const TensorView& cos_sin, const TensorView& q_fp8,
                                const TensorView& q_scale, const TensorView& weights,
                                Stream stream);
using IndexerScoresFn = void(const TensorView& q_fp8, const TensorView& q_scale,
                             const TensorView& weights, const TensorView& positions,
                             const TensorView& token_to_req, const IndexerKeyCacheView& keys,
                             const TensorView& key_block_table, int ratio,
                             const TensorView& scores, Stream stream);
using IndexerTopkFn = void(const TensorView& scores, const TensorView& positions, int ratio,
                           const TensorView& indices, const TensorView& lens, Stream stream,
                           TopkOrder order);
using CompressedPrefixIndicesFn = void(const TensorView& positions, int ratio,
                                       const TensorView& indices, const TensorView& lens,
                                       Stream stream);
// compressor_project's backend step after its two projections (which are dsv4::linear calls):
// score_rows[t] += ape[positions[t] mod r].
using CompressorAddApeFn = void(const CompressorConfig& cfg, const TensorView& ape,
                                const TensorView& positions, const TensorView& score_rows,
                                Stream stream);
using CompressorUpdateAndEmitFn = void(const CompressorConfig& cfg, const TensorView& kv_rows,
                                       const TensorView& score_rows, const CompressorBatch& batch,
                                       const TensorView& norm_weight, const TensorView& cos_sin,
                                       const CompressorStateView& state,
                                       const CompressorOutputView& out, const TensorView& entries,
                                       Stream stream);
using SyntheticHiddenFn = void(const TensorView& req_ids, const TensorView& positions,
                               uint64_t seed, const TensorView& out, Stream stream);
using SparseMlaIndexerQuantizeFn = void(const TensorView& x, const TensorView& positions,
                                        const TensorView& cos_sin, const TensorView& codes,
                                        const TensorView& scales, const TensorView& weights,
                                        Stream stream);
using SparseMlaIndexerKeyInsertFn = void(const TensorView& k, const TensorView& norm_weight,
                                         const TensorView& norm_bias, float eps,
                                         const TensorView& positions, const TensorView& cos_sin,
                                         const IndexerKeyCacheView& keys,
                                         const TensorView& slot_mapping, Stream stream);

inline constexpr OpKey<LinearFn> kLinear{OpId::linear};
inline constexpr OpKey<BatchedLinearFn> kBatchedLinear{OpId::batched_linear};
inline constexpr OpKey<GroupedWoAFn> kGroupedWoA{OpId::grouped_wo_a};
inline constexpr OpKey<QuantizeActFp8Fn> kQuantizeActFp8{OpId::quantize_act_fp8};
inline constexpr OpKey<DequantizeFp8BlocksFn> kDequantizeFp8Blocks{OpId::dequantize_fp8_blocks};
inline constexpr OpKey<RmsNormFn> kRmsNorm{OpId::rms_norm};
inline constexpr OpKey<FusedQkvRmsNormFn> kFusedQkvRmsNorm{OpId::fused_qkv_rms_norm};
inline constexpr OpKey<ResidualAddRmsNormFn> kResidualAddRmsNorm{OpId::residual_add_rms_norm};
inline constexpr OpKey<ApplyRopeFn> kApplyRope{OpId::apply_rope};
inline constexpr OpKey<InvRopeFp8QuantFn> kInvRopeFp8Quant{OpId::inv_rope_fp8_quant};
inline constexpr OpKey<QnormRopeKvInsertFn> kQnormRopeKvInsert{OpId::qnorm_rope_kv_insert};
inline constexpr OpKey<KvQuantizeFn> kKvQuantize{OpId::kv_quantize};
inline constexpr OpKey<KvDequantizeFn> kKvDequantize{OpId::kv_dequantize};
inline constexpr OpKey<DequantizeAndGatherFn> kDequantizeAndGather{OpId::dequantize_and_gather};
inline constexpr OpKey<SparsePrefillFn> kSparsePrefill{OpId::sparse_prefill};
inline constexpr OpKey<SparseDecodeFn> kSparseDecode{OpId::sparse_decode};
inline constexpr OpKey<SparseAttentionCombineFn> kSparseAttentionCombine{
    OpId::sparse_attention_combine};
inline constexpr OpKey<LocalToGlobalSlotsFn> kLocalToGlobalSlots{OpId::local_to_global_slots};
inline constexpr OpKey<SwaWindowIndicesFn> kSwaWindowIndices{OpId::swa_window_indices};
inline constexpr OpKey<CombineTopkSwaIndicesFn> kCombineTopkSwaIndices{
    OpId::combine_topk_swa_indices};
inline constexpr OpKey<IndexerQueryRowsFn> kIndexerQuery{OpId::indexer_query};
inline constexpr OpKey<IndexerScoresFn> kIndexerScores{OpId::indexer_scores};
inline constexpr OpKey<IndexerTopkFn> kIndexerTopk{OpId::indexer_topk};
inline constexpr OpKey<CompressedPrefixIndicesFn> kCompressedPrefixIndices{
    OpId::compressed_prefix_indices};
inline constexpr OpKey<CompressorAddApeFn> kCompressorProject{OpId::compressor_project};
inline constexpr OpKey<CompressorUpdateAndEmitFn> kCompressorUpdateAndEmit{
    OpId::compressor_update_and_emit};
inline constexpr OpKey<SyntheticHiddenFn> kSyntheticHidden{OpId::synthetic_hidden};
inline constexpr OpKey<SparseMlaIndexerQuantizeFn> kSparseMlaIndexerQuantize{
    OpId::sparse_mla_indexer_quantize};
inline constexpr OpKey<SparseMlaIndexerKeyInsertFn> kSparseMlaIndexerKeyInsert{
    OpId::sparse_mla_indexer_key_insert};

}  // namespace dsv4::ops
