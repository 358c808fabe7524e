// Paged KV-cache layouts (docs/spec.md §7): byte geometry, and per-token quantize / dequantize shared by
// the CPU reference and CUDA kernels (DSV4_HD), so both produce and read identical bytes.
//
// A cache is an array of blocks, each `block_bytes` long, holding `block_size` tokens.
// slot = block * block_size + offset.
//
//   MODEL1_FP8 (V4, d = 512 = 448 nope + 64 rope), 584 B/token:
//     block = [block_size x 576 B data rows][block_size x 8 B scale rows], padded to a multiple
//     of 576 B. Data row = 448 fp8 e4m3 (nope) + 64 bf16 (rope). Scale row = 7 UE8M0 bytes (one
//     per 64 nope values) + 1 zero pad byte.
//   V32_FP8 (V3.2, d = 576 = 512 nope + 64 rope), 656 B/token, interleaved per token:
//     512 fp8 (nope) + 4 fp32 scales (one per 128 nope values, UE8M0-rounded powers of two)
//     + 64 bf16 (rope).
//   BF16 (d = 512): 512 bf16 per token (1024 B).
//   FP8_PER_TENSOR (d = 512): 512 fp8 per token (512 B); one fp32 scale for the whole cache
//     (value = fp8 * tensor_scale), held by the caller.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#include "dsv4/dtype.h"
#include "dsv4/fp8_block.h"
#include "dsv4/tensor.h"

namespace dsv4 {

enum class KvLayout : uint8_t { model1_fp8, v32_fp8, bf16, fp8_per_tensor };

constexpr std::string_view kv_layout_name(KvLayout l) {
  switch (l) {
    case KvLayout::model1_fp8: return "MODEL1_FP8";
    case KvLayout::v32_fp8: return "V32_FP8";
    case KvLayout::bf16: return "BF16";
    case KvLayout::fp8_per_tensor: return "FP8_PER_TENSOR";
  }
  return "?";
}
// Parses "model1_fp8" / "MODEL1_FP8" etc.; throws dsv4::Error on an unknown name.
KvLayout parse_kv_layout(std::string_view name);

// Compile-time constants of each layout.
namespace model1 {
inline constexpr int kDim = 512, kNope = 448, kRope = 64, kQuantBlock = 64, kNumScales = 7;
inline constexpr int kDataBytes = kNope + 2 * kRope;  // 576
inline constexpr int kScaleBytes = 8;                 // 7 scales + 1 pad
inline constexpr int kTokenBytes = kDataBytes + kScaleBytes;  // 584
inline constexpr int kBlockAlign = 576;
}  // namespace model1
namespace v32 {
inline constexpr int kDim = 576, kNope = 512, kRope = 64, kQuantBlock = 128, kNumScales = 4;
inline constexpr int kTokenBytes = kNope + 4 * kNumScales + 2 * kRope;  // 656
inline constexpr int kScaleOffset = kNope;                              // 512
inline constexpr int kRopeOffset = kNope + 4 * kNumScales;              // 528
}  // namespace v32

// Byte geometry of one layout at one block size.
struct KvGeometry {
  KvLayout layout;
  int block_size;           // tokens per block
  int dim;                  // logical values per token (512, or 576 for V32_FP8)
  int token_bytes;          // bytes per token (584, 656, 1024, 512)
  int64_t block_bytes;      // bytes per block, including padding

  // Byte offset, from the start of a block, of the token's data (and of its scale row for
  // MODEL1_FP8; for the interleaved layouts scale_offset == data_offset).
  DSV4_HD int64_t data_offset(int offset_in_block) const {
    return layout == KvLayout::model1_fp8 ? int64_t{offset_in_block} * model1::kDataBytes
                                          : int64_t{offset_in_block} * token_bytes;
  }
  DSV4_HD int64_t scale_offset(int offset_in_block) const {
    return layout == KvLayout::model1_fp8
               ? int64_t{block_size} * model1::kDataBytes + int64_t{offset_in_block} * model1::kScaleBytes
               : data_offset(offset_in_block);
  }
};

// Geometry for a layout and block size (block_size >= 1, else dsv4::Error).
KvGeometry kv_geometry(KvLayout layout, int block_size);

// A paged cache as the kernels see it: bytes [num_blocks, block_bytes] (uint8). The bytes of a
// block are dense (strides[1] == 1); blocks start data.strides[0] bytes apart, which may exceed
// block_bytes (a padded block stride, e.g. FlashMLA's V3.2 test caches: 64 tokens x 656 B in
// blocks 42640 B apart). Block b starts at data + b * strides[0].
struct KvCacheView {
  TensorView data;          // uint8 [num_blocks, block_bytes], block stride strides[0]
  KvLayout layout = KvLayout::model1_fp8;
  int block_size = 64;
  float tensor_scale = 1.0f;  // FP8_PER_TENSOR only
  int64_t num_slots() const { return data.ndim == 2 ? data.shape[0] * block_size : 0; }
};
// Validates that `cache.data` matches the layout geometry: dtype uint8, 2-d [num_blocks,
// block_bytes], bytes dense within a block (strides[1] == 1), a 16-byte aligned base and, with
// more than one block, a block stride strides[0] >= block_bytes that is a multiple of 16 (every
// block aligned like the first: scales, rope and 16-byte chunks are read in place); for
// FP8_PER_TENSOR a finite tensor_scale > 0. Every op taking a KvCacheView follows these rules.
void check_kv_cache(const char* where, const char* name, const KvCacheView& cache);

// ---- per-token encode/decode (host and device) --------------------------------------------
// A token's dims [0, kv_plain_begin) are FP8 in scale blocks (MODEL1_FP8: 7 blocks of 64 values,
// V32_FP8: 4 of 128), each with one UE8M0 scale; the other "plain" dims are encoded one value at
// a time (bf16 rope dims, BF16, FP8_PER_TENSOR). The encoder is split along those lines so a
// kernel can encode the scale blocks and the plain dims in parallel and still write exactly the
// bytes kv_encode_token writes (every value's encoding depends only on its own scale block).
DSV4_HD int kv_num_scale_blocks(KvLayout l) {
  return l == KvLayout::model1_fp8 ? model1::kNumScales : l == KvLayout::v32_fp8 ? v32::kNumScales : 0;
}
DSV4_HD int kv_scale_block_width(KvLayout l) {
  return l == KvLayout::model1_fp8 ? model1::kQuantBlock : l == KvLayout::v32_fp8 ? v32::kQuantBlock : 0;
}
// First plain dim (448, 512, or 0 for BF16 / FP8_PER_TENSOR).
DSV4_HD int kv_plain_begin(KvLayout l) { return kv_num_scale_blocks(l) * kv_scale_block_width(l); }

// Scale block s (0 <= s < kv_num_scale_blocks) of the token at `offset` of the block starting at
// `block`: amax → UE8M0 scale 2^k (stored as a byte for MODEL1_FP8, as fp32 for V32_FP8), then
// fp8(value · 2^-k) for each of its values. `values` is the whole token (dim floats).
// Stores scale block s's exponent k (scale 2^k) of the token at `offset`: a UE8M0 byte
// (MODEL1_FP8) or an fp32 power of two (V32_FP8).
DSV4_HD void kv_store_block_scale(const KvGeometry& g, uint8_t* block, int offset, int s, int32_t k) {
  if (g.layout == KvLayout::model1_fp8) {
    block[g.scale_offset(offset) + s] = static_cast<uint8_t>(k + 127);
  } else {
    reinterpret_cast<float*>(block + g.data_offset(offset) + v32::kScaleOffset)[s] = exp2_int(k);
  }
}
DSV4_HD void kv_encode_scale_block(const KvGeometry& g, uint8_t* block, int offset, int s,
                                   const float* values) {
  const int width = kv_scale_block_width(g.layout);
  uint8_t* row = block + g.data_offset(offset);
  kv_store_block_scale(g, block, offset, s, fp8_quantize_block(values + s * width, width, row + s * width));
}

// Plain dim i (kv_plain_begin <= i < dim) of the token: bf16 (the rope dims of the FP8 layouts,
// every dim of BF16) or fp8(value · inv_tensor_scale) (FP8_PER_TENSOR; inv_tensor_scale =
// ieee_div(1, tensor_scale), computed once per token by the caller).
DSV4_HD void kv_encode_plain_value(const KvGeometry& g, uint8_t* block, int offset, int i,
                                   float value, float inv_tensor_scale = 1.0f) {
  uint8_t* row = block + g.data_offset(offset);
  switch (g.layout) {
    case KvLayout::model1_fp8:
      reinterpret_cast<uint16_t*>(row + model1::kNope)[i - model1::kNope] = float_to_bf16_bits(value);
      return;
    case KvLayout::v32_fp8:
      reinterpret_cast<uint16_t*>(row + v32::kRopeOffset)[i - v32::kNope] = float_to_bf16_bits(value);
      return;
    case KvLayout::bf16:
      reinterpret_cast<uint16_t*>(row)[i] = float_to_bf16_bits(value);
      return;
    case KvLayout::fp8_per_tensor:
      row[i] = fp8_encode_scaled(value, inv_tensor_scale);
      return;
  }
}

// The token's padding bytes (the zero pad byte of a MODEL1_FP8 scale row; none otherwise).
DSV4_HD void kv_encode_padding(const KvGeometry& g, uint8_t* block, int offset) {
  if (g.layout == KvLayout::model1_fp8) block[g.scale_offset(offset) + model1::kNumScales] = 0;
}

// Writes one token (values[0..dim), float) into the block starting at `block`.
DSV4_HD void kv_encode_token(const KvGeometry& g, uint8_t* block, int offset, const float* values,
                             float tensor_scale = 1.0f) {
  for (int s = 0; s < kv_num_scale_blocks(g.layout); ++s)
    kv_encode_scale_block(g, block, offset, s, values);
  const float inv_tensor_scale = ieee_div(1.0f, tensor_scale);
  for (int i = kv_plain_begin(g.layout); i < g.dim; ++i)
    kv_encode_plain_value(g, block, offset, i, values[i], inv_tensor_scale);
  kv_encode_padding(g, block, offset);
}

// Reads value i (0 <= i < dim) of the token at `offset` of the block starting at `block`.
DSV4_HD float kv_decode_value(const KvGeometry& g, const uint8_t* block, int offset, int i,
                              float tensor_scale = 1.0f) {
  const uint8_t* row = block + g.data_offset(offset);
  switch (g.layout) {
    case KvLayout::model1_fp8: {
      if (i >= model1::kNope) {
        const uint16_t* rope = reinterpret_cast<const uint16_t*>(row + model1::kNope);
        return bf16_bits_to_float(rope[i - model1::kNope]);
      }
      const uint8_t* scales = block + g.scale_offset(offset);
      return ieee_mul(fp8_e4m3_to_float(row[i]), ue8m0_to_float(scales[i / model1::kQuantBlock]));
    }
    case KvLayout::v32_fp8: {
      if (i >= v32::kNope) {
        const uint16_t* rope = reinterpret_cast<const uint16_t*>(row + v32::kRopeOffset);
        return bf16_bits_to_float(rope[i - v32::kNope]);
      }
      // The fp32 scale is read as bf16 (to nearest even), as FlashMLA reads it (docs/spec.md §7):
      // exact for the UE8M0 scales kv_encode_token writes.
      const float* scales = reinterpret_cast<const float*>(row + v32::kScaleOffset);
      return ieee_mul(fp8_e4m3_to_float(row[i]), round_bf16(scales[i / v32::kQuantBlock]));
    }
    case KvLayout::bf16:
      return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(row)[i]);
    case KvLayout::fp8_per_tensor:
      return fp8_decode_scaled(row[i], tensor_scale);
  }
  return 0.0f;
}

// Dequantizes a whole token into out[0..dim).
DSV4_HD void kv_decode_token(const KvGeometry& g, const uint8_t* block, int offset, float* out,
                             float tensor_scale = 1.0f) {
  for (int i = 0; i < g.dim; ++i) out[i] = kv_decode_value(g, block, offset, i, tensor_scale);
}

// ---- CPU bulk helpers (validated) ---------------------------------------------------------
// Quantizes values [n, dim] (fp32 or bf16) into `cache` at global slots [n] (int64 or int32;
// -1 = skip). Any slot outside the cache, or a slot given twice, is an error and nothing is
// written. Host tensors only; tokens are quantized in parallel (OpenMP). Neither values nor slots
// may lie in the cache's memory (ops.h's output rule).
void kv_quantize(const KvCacheView& cache, const TensorView& values, const TensorView& slots);
// Dequantizes the tokens at slots [n] into out [n, dim] (fp32 or bf16). -1 → row of zeros.
// out: rows may be strided, no two elements at one address, no byte shared with the cache or
// slots.
void kv_dequantize(const KvCacheView& cache, const TensorView& slots, const TensorView& out);

}  // namespace dsv4
