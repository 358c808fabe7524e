// Fused q head-norm + q RoPE + kv RoPE + KV quantization + paged insert. Grid (token, head group):
// block (t, y) normalizes token t's heads 8·y + w, 8·(y + gridDim.y) + w, … (warp w), and blocks
// (t, 0) also encode and store the token's kv. Decode-sized steps get one group per 8 heads: one
// block per token walking all 64–128 heads with its 8 warps in turn is a chain of dependent loads
// per head that held a decode step at ~30 µs whatever its size (measured on the H200). Steps of
// kTokensFillingTheGpu tokens or more keep one block per token, which their token count already
// spreads over the GPU (split there, a 16384-token prefill ran 13 % slower).
//   1. q: warp w of block y normalizes head 8·y + w in place: lane l owns the head's chunks l, l + 32, …
//      (8 consecutive values, one 16-byte load of bf16 when q's rows are 16-byte aligned), adds
//      their squares, the butterfly gives every lane the head's factor (warp_rms.cuh: the CPU's
//      summation order), then the lane reloads its chunks, normalizes them, rotates the rope pairs
//      among them and stores them back (one 16-byte store) — each element read and written by one
//      lane only. q is the bulk of the op's bytes (H · D per token against D for kv). With an FP8
//      query the lane also encodes the roped chunk (fp8(v · 1/q_scale), one 8-byte store of codes
//      by the hardware encoder, bit-identical to dtype.h's) and stores in q what the codes mean.
//   2. kv: the roped fp32 row goes to shared memory; the token is encoded into a one-token block
//      in shared memory with the CPU's own per-scale-block / per-value encoders (kv_layout.h:
//      thread s encodes scale block s, all threads the plain dims), then kv is overwritten with
//      the decoded values and, when the slot is valid, the token's bytes are copied to the cache.
// Encoding into shared memory first makes kv independent of what other tokens store.
#include "cuda/kv/qnorm_rope_kv_insert.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "cuda/common/check.h"
#include "cuda/common/float_rows.cuh"
#include "cuda/common/fp8_convert.cuh"
#include "cuda/common/index_vector.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/rope_table.cuh"
#include "cuda/common/warp_kv_scale_block.cuh"
#include "cuda/norm/warp_rms.cuh"
#include "dsv4/fp8_block.h"

namespace dsv4::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxDim = v32::kDim;  // 576: the widest token
// Chunks of 8 values a lane holds of one q head (the widest head: 576 = 72 chunks over 32 lanes).
constexpr int kMaxChunksPerLane = (kMaxDim / FloatRows::kChunk + 31) / 32;
// Bytes of a one-token block of the largest layout (MODEL1_FP8: 584 B padded to 2 · 576).
constexpr int kScratchBytes =
    (model1::kTokenBytes + model1::kBlockAlign - 1) / model1::kBlockAlign * model1::kBlockAlign;
static_assert(kScratchBytes >= v32::kTokenBytes && kScratchBytes >= 2 * model1::kDim,
              "scratch must hold one token of every layout");
static_assert(model1::kNumScales < kThreads && v32::kNumScales < kThreads,
              "one thread per scale block, plus one for the padding");

// The optional FP8 query [T, H, D] (fp8_e4m3, last dim contiguous): codes of row (t, h) start at
// data + t · token_stride + h · head_stride bytes. data == nullptr: none.
struct Fp8QueryRows {
  uint8_t* data = nullptr;
  int64_t token_stride = 0, head_stride = 0;
  float scale = 1.0f, inv_scale = 1.0f;  // q = fp8 · scale; codes = fp8(q · inv_scale)

  static Fp8QueryRows of(const Fp8QueryOutput& out) {
    Fp8QueryRows r;
    if (!out.q_fp8.defined()) return r;
    r.data = static_cast<uint8_t*>(out.q_fp8.data);
    r.token_stride = out.q_fp8.strides[0];
    r.head_stride = out.q_fp8.strides[1];
    r.scale = out.q_scale;
    r.inv_scale = ieee_div(1.0f, out.q_scale);  // once, as the CPU kernel
    return r;
  }
  // Whether every row starts 8-byte aligned: a chunk of 8 codes is then one 8-byte store.
  bool rows_aligned8() const {
    return reinterpret_cast<uintptr_t>(data) % 8 == 0 && token_stride % 8 == 0 && head_stride % 8 == 0;
  }
  // Elements [i, min(i + 8, n)) of row (t, h), roped in v: their codes into the row, and v ← the
  // values the codes mean (fp8 · scale), which q then stores. kVector (rows_aligned8): a whole
  // chunk is one 8-byte store of hardware-encoded codes.
  template <bool kVector>
  __device__ __forceinline__ void quantize_chunk(int64_t t, int64_t h, int64_t i, int64_t n,
                                                 float v[FloatRows::kChunk]) const {
    constexpr int kChunk = FloatRows::kChunk;
    static_assert(kChunk == 8, "a chunk of codes is one 8-byte store");
    uint8_t* codes = data + t * token_stride + h * head_stride + i;
    float scaled[kChunk];
#pragma unroll
    for (int k = 0; k < kChunk; ++k) scaled[k] = ieee_mul(v[k], inv_scale);
    if (kVector && i + kChunk <= n) {
      const uint2 packed = fp8x8_e4m3_encode(scaled);
      *reinterpret_cast<uint2*>(codes) = packed;
#pragma unroll
      for (int k = 0; k < kChunk; ++k)
        v[k] = fp8_decode_scaled(static_cast<uint8_t>((k < 4 ? packed.x : packed.y) >> (8 * (k % 4))), scale);
      return;
    }
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      if (i + k >= n) continue;
      const uint8_t code = float_to_fp8_e4m3(scaled[k]);
      codes[k] = code;
      v[k] = fp8_decode_scaled(code, scale);
    }
  }
};

struct InsertParams {
  FloatRows q;   // rows (t, h): T · heads rows of D
  int64_t q_token_stride, q_head_stride;  // q's leading strides: row (t, h) at t·ts + h·hs
  Fp8QueryRows q_fp8;  // optional
  FloatRows kv;  // rows t: T rows of D
  int64_t heads;
  IndexVector positions;  // [T]
  IndexVector slots;      // [T]
  RopeTable table;
  float eps;
  KvGeometry geometry;          // of the cache
  KvGeometry scratch_geometry;  // the same layout with block_size 1
  uint8_t* cache;
  int64_t block_stride;  // bytes between cache blocks
  int64_t num_slots;
  float tensor_scale;
};

// kLaneChunks: the chunks a lane holds of one head, ⌈D / 8 / 32⌉ (2 for D = 512, 3 for 576), a
// template argument so the common head keeps only what it needs in registers. Up to 2 chunks
// the registers are capped at 64 (four blocks an SM; unbounded, ptxas took 106 for the early
// loads it hoists, two blocks an SM), at the price of a 12–16-byte spill outside the q loop.
template <int kLaneChunks>
constexpr int kMinBlocksPerSm = kLaneChunks <= 2 ? 4 : 1;
template <bool kVector, int kLaneChunks>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm<kLaneChunks>) qnorm_rope_kv_insert_kernel(const InsertParams p) {
  grid_dependency_entry();
  __shared__ float row[kMaxDim];
  __shared__ __align__(16) uint8_t scratch[kScratchBytes];
  const int64_t t = blockIdx.x;
  const int64_t pos = p.positions[t];
  if (!p.table.contains(pos)) return;  // invalid position: the whole block skips the token
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int64_t D = p.kv.row_len, nope = D - 2 * p.table.half;

  // 1. q heads: RMSNorm without weight, then RoPE, in place. A lane's chunks of the head stay in
  // registers between the sum and the update (one read of q), and the row offset is two
  // multiplies: the generic FloatRows::row_offset's 64-bit divisions and the second read made
  // this loop issue-bound in a 16384-token prefill (Nsight Compute: 80 % SM, 33 % DRAM).
  constexpr int kChunk = FloatRows::kChunk;
  const int chunks = static_cast<int>((D + kChunk - 1) / kChunk);
  float v[kLaneChunks][kChunk];
  for (int64_t h = blockIdx.y * kWarps + warp; h < p.heads; h += int64_t{gridDim.y} * kWarps) {
    const int64_t q_off = t * p.q_token_stride + h * p.q_head_stride;
    float partial = 0.0f;
#pragma unroll
    for (int j = 0; j < kLaneChunks; ++j) {
      const int c = lane + 32 * j;
      if (c >= chunks) break;
      p.q.load_chunk<kVector>(q_off, c * kChunk, D, v[j]);
      partial = rms_accumulate_chunk(partial, v[j], D - c * kChunk < kChunk ? static_cast<int>(D - c * kChunk) : kChunk);
    }
    const float inv = math::rms_inverse_of_sum(warp_rms_total(partial), D, p.eps);
#pragma unroll
    for (int j = 0; j < kLaneChunks; ++j) {
      const int c = lane + 32 * j;
      if (c >= chunks) break;
      const int64_t i = int64_t{c} * kChunk;
#pragma unroll
      for (int k = 0; k < kChunk; ++k) v[j][k] = math::rms_apply(v[j][k], inv, 1.0f);
      if (i + kChunk > nope) {  // a chunk holding rope dims: pairs (2j, 2j + 1) never straddle one (nope is even)
#pragma unroll
        for (int k = 0; k < kChunk / 2; ++k)
          if (i + 2 * k >= nope && i + 2 * k + 1 < D)
            p.table.rotate(pos, static_cast<int>((i + 2 * k - nope) / 2), v[j][2 * k], v[j][2 * k + 1]);
      }
      if (p.q_fp8.data != nullptr) p.q_fp8.quantize_chunk<kVector>(t, h, i, D, v[j]);
      p.q.store_chunk<kVector>(q_off, i, D, v[j]);
    }
  }

  if (blockIdx.y != 0) return;  // uniform: the kv row is block (t, 0)'s

  // 2. kv: RoPE into shared memory.
  const int64_t kv_off = p.kv.row_offset(t);
  for (int64_t i = tid; i < nope; i += kThreads) row[i] = p.kv.load(kv_off, i);
  for (int j = tid; j < p.table.half; j += kThreads) {
    float a = p.kv.load(kv_off, nope + 2 * j), b = p.kv.load(kv_off, nope + 2 * j + 1);
    p.table.rotate(pos, j, a, b);
    row[nope + 2 * j] = a;
    row[nope + 2 * j + 1] = b;
  }
  __syncthreads();

  // Encode into the one-token scratch block (scale blocks, padding and plain dims touch
  // disjoint bytes).
  const KvGeometry& sg = p.scratch_geometry;
  const int num_scale_blocks = kv_num_scale_blocks(sg.layout);
  if (warp < num_scale_blocks) warp_encode_kv_scale_block(sg, scratch, 0, warp, row, lane);  // 7 or 4 <= kWarps
  if (tid == num_scale_blocks) kv_encode_padding(sg, scratch, 0);
  const float inv_tensor_scale = ieee_div(1.0f, p.tensor_scale);
  for (int i = kv_plain_begin(sg.layout) + tid; i < sg.dim; i += kThreads)
    kv_encode_plain_value(sg, scratch, 0, i, row[i], inv_tensor_scale);
  __syncthreads();

  // kv ← exactly what the cache holds.
  for (int i = tid; i < sg.dim; i += kThreads)
    p.kv.store(kv_off, i, kv_decode_value(sg, scratch, 0, i, p.tensor_scale));

  // Store the token's bytes (its data row and, for MODEL1_FP8, its scale row).
  const int64_t slot = p.slots[t];
  if (slot < 0 || slot >= p.num_slots) return;  // -1 (or an invalid slot): not stored
  const KvGeometry& g = p.geometry;
  uint8_t* block = p.cache + (slot / g.block_size) * p.block_stride;
  const int offset = static_cast<int>(slot % g.block_size);
  const bool split_rows = g.layout == KvLayout::model1_fp8;
  const int data_bytes = split_rows ? model1::kDataBytes : g.token_bytes;
  for (int b = tid; b < data_bytes; b += kThreads)
    block[g.data_offset(offset) + b] = scratch[sg.data_offset(0) + b];
  if (split_rows) {
    for (int b = tid; b < model1::kScaleBytes; b += kThreads)
      block[g.scale_offset(offset) + b] = scratch[sg.scale_offset(0) + b];
  }
}

template <int kLaneChunks>
void launch_insert(const InsertParams& p, bool vector, const dim3& grid, Stream stream) {
  if (vector)
    launch_kernel("qnorm_rope_kv_insert", qnorm_rope_kv_insert_kernel<true, kLaneChunks>, {grid, kThreads, 0},
                  stream, p);
  else
    launch_kernel("qnorm_rope_kv_insert", qnorm_rope_kv_insert_kernel<false, kLaneChunks>,
                  {grid, kThreads, 0}, stream, p);
}
void launch_insert(const InsertParams& p, bool vector, int lane_chunks, const dim3& grid, Stream stream) {
  static_assert(kMaxChunksPerLane == 3, "one instantiation per chunks-per-lane count");
  if (lane_chunks <= 1)
    launch_insert<1>(p, vector, grid, stream);
  else if (lane_chunks == 2)
    launch_insert<2>(p, vector, grid, stream);
  else
    launch_insert<3>(p, vector, grid, stream);
}

}  // namespace

void qnorm_rope_kv_insert(const TensorView& q, const TensorView& kv, const TensorView& positions,
                          const TensorView& cos_sin, float eps, const KvCacheView& cache,
                          const TensorView& slot_mapping, const Fp8QueryOutput& fp8_query,
                          Stream stream) {
  constexpr const char* kOp = "qnorm_rope_kv_insert";
  InsertParams p;
  p.q = FloatRows::of(q);
  p.q_token_stride = q.strides[0];  // q is [T, H, D] (validated by the op)
  p.q_head_stride = q.strides[1];
  p.q_fp8 = Fp8QueryRows::of(fp8_query);
  p.kv = FloatRows::of(kv);
  const int64_t T = kv.shape[0];
  if (T == 0) return;  // nothing to write
  p.heads = q.shape[1];
  p.positions = IndexVector::of(positions);
  p.slots = IndexVector::of(slot_mapping);
  p.table = RopeTable::of(cos_sin);
  p.eps = eps;
  p.geometry = kv_geometry(cache.layout, cache.block_size);
  p.scratch_geometry = kv_geometry(cache.layout, 1);
  p.cache = static_cast<uint8_t*>(cache.data.data);
  p.block_stride = cache.data.strides[0];
  p.num_slots = cache.num_slots();
  p.tensor_scale = cache.tensor_scale;
  DSV4_CHECK(p.kv.row_len == p.geometry.dim && p.geometry.dim <= kMaxDim &&
                 p.scratch_geometry.block_bytes <= kScratchBytes,
             kOp, ": kv.shape[1]: expected the layout's dim (at most ", kMaxDim, "), got ",
             p.kv.row_len);
  DSV4_CHECK(T <= INT_MAX, kOp, ": kv: expected at most ", INT_MAX, " tokens, got ", T);
  // Small steps: one head group per 8 heads (at least one block per token, for kv; at most the
  // grid's y limit, beyond which the groups stride). Large steps: one block per token.
  constexpr int64_t kTokensFillingTheGpu = 512;
  constexpr int64_t kMaxGroups = 65535;
  const int64_t groups = T >= kTokensFillingTheGpu ? 1 : std::clamp<int64_t>((p.heads + kWarps - 1) / kWarps, 1, kMaxGroups);
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(groups));
  // The vector path moves q in 16-byte and the FP8 query in 8-byte pieces; either misaligned
  // takes the element-wise path (same bytes).
  const bool vector = p.q.rows_aligned16() && (p.q_fp8.data == nullptr || p.q_fp8.rows_aligned8());
  const int lane_chunks = static_cast<int>((p.kv.row_len + FloatRows::kChunk * 32 - 1) / (FloatRows::kChunk * 32));
  launch_insert(p, vector, lane_chunks, grid, stream);
}

}  // namespace dsv4::cuda
