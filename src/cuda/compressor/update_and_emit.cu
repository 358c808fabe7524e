// compressor_update_and_emit on CUDA: maps the validated views to kernel parameters, checks what
// only the kernels need (alignment of the indexer keys' fp32 scales), then launches
//   1. emit_entries_kernel   — every entry completed by the batch (reads the rings),
//   2. save_ring_rows_kernel — this call's rows the next call needs (writes the rings),
// in that order on `stream`: a batch that runs past a ring's length overwrites ring rows that
// step 1 still reads (position p and p + K share ring row p mod K).
#include <cmath>
#include <cstdint>

#include "math/hadamard.h"
#include "cuda/common/check.h"
#include "cuda/compressor/compressor.h"
#include "cuda/compressor/emit_entries.cuh"
#include "cuda/compressor/save_ring_rows.cuh"
#include "cuda/compressor/update_params.cuh"

namespace dsv4::cuda {
namespace {

constexpr const char* kOp = "compressor_update_and_emit";

compressor::UpdateParams make_params(const CompressorConfig& cfg, const TensorView& kv_rows,
                                     const TensorView& score_rows, const CompressorBatch& batch,
                                     const TensorView& norm_weight, const TensorView& cos_sin,
                                     const CompressorStateView& state,
                                     const CompressorOutputView& out, const TensorView& entries) {
  compressor::UpdateParams p;
  p.D = cfg.head_dim;
  p.r = cfg.ratio;
  p.K = cfg.ring_rows();
  p.coff = cfg.coff();
  p.rope_dims = cfg.rope_dims;
  p.W = cfg.proj_width();
  p.eps = cfg.eps;
  p.T = batch.positions.size(0);
  p.R = batch.context_lens.size(0);
  p.kv_rows = kv_rows.ptr<const float>();
  p.score_rows = score_rows.ptr<const float>();
  p.kv_stride = kv_rows.stride(0);
  p.score_stride = score_rows.stride(0);
  p.positions = IndexVector::of(batch.positions);
  p.token_to_req = IndexVector::of(batch.token_to_req);
  p.context_lens = IndexVector::of(batch.context_lens);
  p.norm_weight = norm_weight.data;
  p.norm_bf16 = norm_weight.dtype == DType::bf16;
  p.rope = RopeTable::of(cos_sin);
  p.state_rows = state.rows.ptr<float>();
  p.state_stride = state.rows.stride(0);
  p.state_table = compressor::BlockTable::of(state.block_table, state.block_size,
                                             state.rows.size(0));
  p.target = cfg.target;
  if (cfg.target == CompressorTarget::kv_cache) {
    const KvCacheView& cache = out.kv_cache;
    p.out_data = cache.data.ptr<uint8_t>();
    p.out_stride = cache.data.stride(0);
    p.out_table = compressor::BlockTable::of(out.block_table, cache.block_size, cache.num_slots());
    p.geometry = kv_geometry(cache.layout, cache.block_size);
    p.tensor_scale = cache.tensor_scale;
  } else {
    const IndexerKeyCacheView& keys = out.indexer_keys;
    // indexer_key_encode stores each entry's scale as one fp32 at a 4-byte multiple from its
    // block's start: on the GPU, blocks must start 4-byte aligned.
    DSV4_CHECK(reinterpret_cast<uintptr_t>(keys.data.data) % 4 == 0 &&
                   keys.data.stride(0) % 4 == 0,
               kOp, ": out.indexer_keys.data: expected 4-byte aligned blocks on CUDA (fp32 scales)",
               ", got base ", keys.data.data, " and a block stride of ", keys.data.stride(0),
               " bytes");
    p.out_data = keys.data.ptr<uint8_t>();
    p.out_stride = keys.data.stride(0);
    p.out_table = compressor::BlockTable::of(out.block_table, keys.block_size, keys.num_slots());
    p.hadamard_scale = math::hadamard_scale(cfg.head_dim);  // math::hadamard_rotate's
  }
  if (entries.defined()) {
    p.entries = entries.ptr<float>();
    p.entries_stride = entries.stride(0);
  }
  return p;
}

}  // namespace

void compressor_update_and_emit(const CompressorConfig& cfg, const TensorView& kv_rows,
                                const TensorView& score_rows, const CompressorBatch& batch,
                                const TensorView& norm_weight, const TensorView& cos_sin,
                                const CompressorStateView& state, const CompressorOutputView& out,
                                const TensorView& entries, Stream stream) {
  const compressor::UpdateParams p =
      make_params(cfg, kv_rows, score_rows, batch, norm_weight, cos_sin, state, out, entries);
  if (p.T == 0) return;
  DSV4_CHECK(p.T <= INT32_MAX, kOp, ": T: expected <= 2^31 - 1 tokens on CUDA, got ", p.T);
  DSV4_CHECK(p.D <= compressor::kMaxDim && p.K <= compressor::kMaxRingRows && p.K <= p.D, kOp,
             ": cfg: head_dim ", p.D, " / ring rows ", p.K, " exceed the kernel's limits");
  const unsigned grid = static_cast<unsigned>(p.T);
  launch_kernel(kOp, compressor::emit_entries_kernel, {grid, static_cast<unsigned>(p.D), 0}, stream, p);
  launch_kernel(kOp, compressor::save_ring_rows_kernel, {grid, compressor::kSaveThreads, 0}, stream, p);
}

}  // namespace dsv4::cuda
