// Weights of one DeepSeek-V4 attention layer: random generation, loading from a checkpoint (or
// any store of tensors) under the official tensor names, saving under the same names.
//
// Checkpoint naming (the DeepSeek-V4-Flash/Pro Hugging Face checkpoints, which keep the names of
// the official inference/model.py; `P` = "layers.{i}.attn." for main layers, "mtp.{j}.attn." for
// the j-th MTP block, whose layer index is n_layers() - n_mtp_layers + j):
//   P wq_a.weight [q_lora, dim]            P wq_a.scale  (FP8 weights only, see below)
//   P q_norm.weight [q_lora]
//   P wq_b.weight [H*D, q_lora]            P wq_b.scale
//   P wkv.weight [D, dim]                  P wkv.scale
//   P kv_norm.weight [D]
//   P wo_a.weight [G*o_lora, H*D/G]        P wo_a.scale
//   P wo_b.weight [dim, G*o_lora]          P wo_b.scale
//   P attn_sink [H] (fp32)
// ratio > 0 layers (coff = 2 for ratio 4, 1 for ratio 128):
//   P compressor.wkv.weight [coff*D, dim]  P compressor.wgate.weight [coff*D, dim]
//   P compressor.ape [ratio, coff*D] (fp32)
//   P compressor.norm.weight [D]
// ratio 4 layers, the indexer (I = index_n_heads, d = index_head_dim, its compressor has ratio 4):
//   P indexer.wq_b.weight [I*d, q_lora]    P indexer.weights_proj.weight [I, dim]
//   P indexer.compressor.wkv.weight [2*d, dim]   P indexer.compressor.wgate.weight [2*d, dim]
//   P indexer.compressor.ape [4, 2*d] (fp32)     P indexer.compressor.norm.weight [d]
// Also accepted when loading: the Hugging Face transformers spelling "model.layers.{i}.self_attn."
// (or "model.layers.{i}.attn.") for P, and "<w>.weight_scale_inv" for "<w>.scale".
//
// dtypes: a linear weight (every `Weight` below) is bf16, fp16, fp32, or fp8 e4m3 with one scale
// per 128x128 block, the scale tensor in ue8m0 (safetensors F8_E8M0) or fp32; dequantized
// w[r][c] = fp8(value[r][c]) * scale[r/128][c/128]. In the checkpoint the block grid covers the
// 2-d matrix above ([rows, cols] -> scale [ceil(rows/128), ceil(cols/128)]). In memory a weight
// [..., rows, cols] has scale [..., ceil(rows/128), ceil(cols/128)] (weight_scale_shape): the same
// for 2-d weights; wo_a is held per group, value [G, o_lora, H*D/G] and scale
// [G, ceil(o_lora/128), ceil(H*D/G/128)] (the layout ops.h grouped_wo_a takes). Loading and saving
// convert between the two; this is exact when o_lora is a multiple (all released models) or a
// divisor of 128, and refused otherwise. Only fp8 weights have a scale. Norm weights are bf16 or
// fp32; ape and attn_sink are fp32. Loading keeps the stored dtypes (no conversion): use
// dequantize_weight() for an fp32 copy.
//
// Only V4-family configs have these weights (V3.2's MLA weights are a different set).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dsv4/config.h"
#include "dsv4/safetensors.h"
#include "dsv4/tensor.h"

namespace dsv4 {

// Side of the square weight-quantization blocks.
inline constexpr int kWeightScaleBlock = 128;

// A linear weight: value [out, in] (wo_a: [G, o_lora, H*D/G], the checkpoint's [G*o_lora, H*D/G]
// split per group) and, for fp8 values only, its block scales (weight_scale_shape(value shape)).
struct Weight {
  HostTensor value;
  HostTensor scale;  // undefined (no data) unless value is fp8

  bool quantized() const { return scale.view().defined(); }
};

// A compressor (docs/spec.md §4): the main one (head dim D) or the indexer's (head dim index_head_dim).
struct CompressorWeights {
  Weight wkv;       // [coff*hd, dim]
  Weight wgate;     // [coff*hd, dim]
  HostTensor ape;   // [ratio, coff*hd] fp32
  HostTensor norm;  // [hd]
};

// The C4A indexer (docs/spec.md §5).
struct IndexerWeights {
  Weight wq_b;                   // [index_n_heads*index_head_dim, q_lora]
  Weight weights_proj;           // [index_n_heads, dim]
  CompressorWeights compressor;  // ratio 4, head dim index_head_dim
};

struct AttentionWeights {
  int layer = 0;
  int compress_ratio = 0;                       // 0, 4 or 128 (the config's ratio of `layer`)
  Weight wq_a;                                  // [q_lora, dim]
  HostTensor q_norm;                            // [q_lora]
  Weight wq_b;                                  // [H*D, q_lora]
  Weight wkv;                                   // [D, dim]
  HostTensor kv_norm;                           // [D]
  Weight wo_a;                                  // [G, o_lora, H*D/G]
  Weight wo_b;                                  // [dim, G*o_lora]
  HostTensor attn_sink;                         // [H] fp32
  std::optional<CompressorWeights> compressor;  // iff compress_ratio > 0
  std::optional<IndexerWeights> indexer;        // iff compress_ratio == 4
};

// "layers.{i}.attn." or "mtp.{j}.attn." (see above). Throws for a layer out of range.
std::string attention_tensor_prefix(const ModelConfig& cfg, int layer);
// Every checkpoint tensor name of the layer's weights with the given fp8-ness (scales included
// for fp8 weights), sorted.
std::vector<std::string> attention_tensor_names(const AttentionWeights& w, const ModelConfig& cfg);

// Deterministic random weights for tests and benchmarks (same (cfg, layer, seed, fp8), same bytes,
// on every platform): linear weights N(0, 1/fan_in) so projections of O(1) activations stay O(1);
// norms 1 + N(0, 0.05²); ape N(0, 0.5²); attn_sink N(0, 1). fp8 == true: the weights the official
// checkpoint stores in fp8 (wq_a, wq_b, wkv, wo_a, wo_b, indexer.wq_b) are quantized per 128x128
// block with ue8m0 scales; the rest (compressor wkv/wgate, indexer weights_proj) and every
// weight with fp8 == false are bf16; norms bf16. With fp8 == true the dtypes are exactly those of
// the released DeepSeek-V4-Flash checkpoint (F8_E4M3 + F8_E8M0 scales, BF16, F32 ape/attn_sink).
AttentionWeights random_attention_weights(const ModelConfig& cfg, int layer, uint64_t seed,
                                          bool fp8);

// Checks every tensor's presence, shape and dtype against the config (and fp8 scales against
// their weights); throws dsv4::Error("<where>: <tensor name>: expected ..., got ...").
void validate_attention_weights(const AttentionWeights& w, const ModelConfig& cfg,
                                const char* where = "validate_attention_weights");

// Where load_attention_weights reads a layer's tensors from, by checkpoint name: a Checkpoint,
// an in-memory TensorMap, or a caller's store (the Python bindings read a torch state dict).
// Only the layer's own tensors are looked at; the store may hold any others.
class TensorSource {
 public:
  struct Info {
    DType dtype = DType::fp32;
    std::vector<int64_t> shape;
  };
  virtual ~TensorSource() = default;
  virtual bool contains(const std::string& name) const = 0;
  virtual Info info(const std::string& name) const = 0;        // `name` is contained
  // The tensor, contiguous on the host (it may share the store's memory).
  virtual HostTensor read(const std::string& name) const = 0;
  virtual std::string description() const = 0;  // for errors, e.g. "checkpoint '<dir>'"
};

// Reads the layer's tensors from the checkpoint / tensor map / source. Throws dsv4::Error naming
// the tensor for a missing tensor, a wrong shape or dtype (expected and actual), a missing or
// mis-shaped scale.
AttentionWeights load_attention_weights(const Checkpoint& ckpt, const ModelConfig& cfg, int layer);
AttentionWeights load_attention_weights(const TensorMap& tensors, const ModelConfig& cfg,
                                        int layer);
AttentionWeights load_attention_weights(const TensorSource& source, const ModelConfig& cfg,
                                        int layer);

// Adds the layer's tensors under their checkpoint names (wo_a as the 2-d [G*o_lora, H*D/G]).
void add_attention_tensors(const AttentionWeights& w, const ModelConfig& cfg, TensorMap& out);
// Writes the given layers to one safetensors file (tests generate tiny checkpoints with it).
void save_attention_weights(const std::string& path, const ModelConfig& cfg,
                            const std::vector<AttentionWeights>& layers,
                            const MetadataMap& metadata = {{"format", "pt"}});

// The block-scale grid of a weight [..., rows, cols]: [..., ceil(rows/128), ceil(cols/128)]
// (leading dims index separate matrices, e.g. wo_a's groups).
std::vector<int64_t> weight_scale_shape(const std::vector<int64_t>& value_shape);

// fp8 e4m3 quantization of a float-like weight of >= 2 dims, per 128x128 block of each matrix
// (see weight_scale_shape) with power-of-two scales 2^ceil(log2(max(amax/448, 1e-4)))
// (docs/spec.md §7), stored as ue8m0 or fp32 (scale_dtype).
Weight quantize_weight_fp8(const HostTensor& w, DType scale_dtype = DType::ue8m0);
// An fp32 copy of the weight (value's shape), block scales applied for fp8.
HostTensor dequantize_weight(const Weight& w);
// The block scales of an fp8 weight as the CUDA FP8 GEMMs take them (cuBLASLt's 128×128 mode, see
// ops.h linear): fp32 (a UE8M0 scale converts exactly), [..., ceil(rows/128),
// fp8_weight_scale_row_stride(cols)] — each row of the grid padded with 1.0 to a multiple of 4
// scales. Its [..., ceil(rows/128), ceil(cols/128)] column window is the `w_scale` view.
HostTensor cuda_weight_scale(const Weight& w);

}  // namespace dsv4
