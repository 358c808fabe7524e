// The CPU kernel of sparse_decode: each (b, s_q, split) item attends its slice of the
// row's compact index list (the main scope's counted entries, then the extra one's) into the workspace partials, then the
// shared combine merges the splits and applies the sink.
#include <algorithm>
#include <cstdint>

#include "cpu/attention_core.h"
#include "cpu/kernels.h"
#include "cpu/sparse_combine.h"
#include "math/softmax_scale.h"

namespace dsv4::cpu {

namespace {

// One index scope as the CPU fetcher sees it.
struct Scope {
  KvGeometry geometry;
  const uint8_t* blocks;
  int64_t block_stride;  // bytes between blocks
  float tensor_scale;
  const int32_t* indices;  // [b, s_q, topk], strides below (last dim dense)
  int64_t indices_b_stride, indices_s_stride;
  const int32_t* lengths;  // [b] or nullptr
  int64_t topk;

  static Scope of(const KvCacheView& cache, const TensorView& indices, const TensorView& lengths) {
    return Scope{kv_geometry(cache.layout, cache.block_size), cache.data.ptr<const uint8_t>(),
                 cache.data.strides[0], cache.tensor_scale, indices.ptr<const int32_t>(),
                 indices.strides[0], indices.strides[1], lengths.ptr<const int32_t>(),
                 indices.shape[2]};
  }
  // Entries of query batch bi that count: topk_length clamped to [0, topk].
  int64_t counted(int64_t bi) const {
    return lengths ? std::clamp<int64_t>(lengths[bi], 0, topk) : topk;
  }
  // Dequantizes slot k (< counted(bi)) of query row (bi, si) into `dst`, rounded to bf16 as the
  // CUDA kernel's tensor-core operands are (exact for MODEL1 and BF16; FP8_PER_TENSOR's and
  // V32's fp32 scales make fp8 · scale a wider product); false when invalid.
  bool fetch(int64_t bi, int64_t si, int64_t k, float* dst) const {
    const int32_t slot = indices[bi * indices_b_stride + si * indices_s_stride + k];
    if (slot < 0) return false;
    const int bs = geometry.block_size;
    kv_decode_token(geometry, blocks + (slot / bs) * block_stride, slot % bs, dst, tensor_scale);
    for (int d = 0; d < geometry.dim; ++d) dst[d] = round_bf16(dst[d]);
    return true;
  }
};

// The query shapes of a validated call.
struct DecodeDims {
  int64_t b, s_q, h, d_qk, topk, extra_topk;
  float scale;
  static DecodeDims of(const SparseDecodeArgs& a) {
    const bool has_extra = a.extra_k_cache.data.defined();
    return {a.q.shape[0],        a.q.shape[1],
            a.q.shape[2],        a.q.shape[3],
            a.indices.shape[2],  has_extra ? a.extra_indices.shape[2] : 0,
            math::effective_softmax_scale(a.softmax_scale, a.q.shape[3])};
  }
};

// Each (b, s_q, split) item attends its slice of the row's compact list into the partials: the
// main scope's counted entries, then the extra scope's (as the CUDA kernel cuts its splits, so a
// split past the row's counted entries is an empty row).
void attend_splits(const SparseDecodeArgs& a, const DecodeDims& dims,
                   const DecodeSchedule& schedule, const TensorView& partial_o,
                   const TensorView& partial_lse) {
  const Scope main = Scope::of(a.k_cache, a.indices, a.topk_length);
  const bool has_extra = dims.extra_topk > 0;
  const Scope extra = has_extra ? Scope::of(a.extra_k_cache, a.extra_indices, a.extra_topk_length)
                                : Scope{};
  const int64_t rows = dims.b * dims.s_q, splits = schedule.num_splits;
  const int h = static_cast<int>(dims.h), d_qk = static_cast<int>(dims.d_qk), d_v = a.d_v;
  const bool q_fp8 = a.q.dtype == DType::fp8_e4m3;
  float* po = partial_o.ptr<float>();
  float* plse = partial_lse.ptr<float>();

#pragma omp parallel
  {
    QueryAttention attention(h, d_qk, d_v, dims.scale);
#pragma omp for schedule(dynamic)
    for (int64_t item = 0; item < rows * splits; ++item) {
      const int64_t row = item / splits, split = item % splits;
      const int64_t bi = row / dims.s_q, si = row % dims.s_q;
      const int64_t q_row = bi * a.q.strides[0] + si * a.q.strides[1];
      if (q_fp8)
        attention.set_query_fp8(a.q.ptr<const uint8_t>() + q_row, a.q.strides[2], a.q_scale);
      else
        attention.set_query(a.q.ptr<const uint16_t>() + q_row, a.q.strides[2]);
      const int64_t main_len = main.counted(bi);
      const int64_t total = main_len + (has_extra ? extra.counted(bi) : 0);
      const int64_t begin = std::min(split * schedule.split_len, total);
      const int64_t end = std::min(begin + schedule.split_len, total);
      // Entry k of the compact list: the main scope's for k < main_len, then the extra scope's.
      attention.attend(begin, end, [&](int64_t k, float* dst) {
        return k < main_len ? main.fetch(bi, si, k, dst) : extra.fetch(bi, si, k - main_len, dst);
      });
      for (int hi = 0; hi < h; ++hi) {
        const int64_t head_row = row * h + hi;
        attention.softmax().write_partial(hi, po + (head_row * splits + split) * d_v,
                                          plse + head_row * splits + split);
      }
    }
  }
}

}  // namespace

void sparse_decode(const SparseDecodeArgs& args, const DecodeSchedule& schedule,
                   const TensorView& workspace, Stream /*stream*/) {
  const DecodeDims dims = DecodeDims::of(args);
  // Carve the partials out of the workspace (layout documented in ops.h): partial_o
  // [b, s_q, H, splits, d_v] then partial_lse [b, s_q, H, splits], both fp32.
  uint8_t* base = workspace.ptr<uint8_t>();
  const int64_t splits = schedule.num_splits;
  const TensorView partial_o(base, DType::fp32, {dims.b, dims.s_q, dims.h, splits, int64_t{args.d_v}});
  const int64_t partial_o_bytes = partial_o.numel() * static_cast<int64_t>(sizeof(float));
  const TensorView partial_lse(base + partial_o_bytes, DType::fp32, {dims.b, dims.s_q, dims.h, splits});
  attend_splits(args, dims, schedule, partial_o, partial_lse);
  combine_partials(partial_o, partial_lse, args.attn_sink.ptr<const float>(), args.out, args.lse);
}

}  // namespace dsv4::cpu
