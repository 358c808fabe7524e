// AttentionWeights: one table of the layer's tensors (checkpoint name, shape, dtype rules, init)
// drives random generation, validation, loading and saving, so the four cannot drift apart.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "dsv4/weights.h"
#include "weights/weights_detail.h"

namespace dsv4 {

namespace {

using Shape = std::vector<int64_t>;

using weights_detail::shape_text;

// wo_a's scales: in memory one grid per group ([G, ceil(L/128), ceil(K/128)], what grouped_wo_a
// takes), in the checkpoint one grid over the stacked [G*L, K] matrix. Each per-group 128-row
// block must lie inside one checkpoint 128-row block for the two to describe the same weight:
// true when L % 128 == 0 (every released model) or 128 % L == 0 (tiny test configs).
struct GroupedRows {
  int64_t groups;
  int64_t rows;  // L, rows per group

  int64_t group_blocks() const { return (rows + kWeightScaleBlock - 1) / kWeightScaleBlock; }
  // The checkpoint row block holding per-group block (g, b); throws when it straddles two.
  int64_t stacked_block(const char* where, const std::string& name, int64_t g, int64_t b) const {
    const int64_t first = g * rows + b * kWeightScaleBlock;
    const int64_t last = g * rows + std::min(rows, (b + 1) * kWeightScaleBlock) - 1;
    if (first / kWeightScaleBlock != last / kWeightScaleBlock)
      fail(where, ": ", name, ": groups of ", rows,
           " rows straddle the checkpoint's 128-row scale blocks (per-group scales need rows "
           "per group to be a multiple or a divisor of 128)");
    return first / kWeightScaleBlock;
  }
};

enum class SlotKind : uint8_t {
  linear,  // Weight: "<key>.weight" (+ "<key>.scale" when fp8)
  norm,    // RMSNorm weight: "<key>.weight", bf16 or fp32
  param,   // raw fp32 parameter: "<key>"
};

// One tensor of the layer.
struct Slot {
  std::string key;  // name after the layer prefix, without ".weight"
  SlotKind kind = SlotKind::linear;
  Weight* weight = nullptr;      // linear
  HostTensor* tensor = nullptr;  // norm, param
  Shape shape;                   // in memory
  Shape stored_shape;            // in the checkpoint (differs for wo_a only: [G*L, K] vs [G, L, K])
  bool fp8_in_checkpoint = false;  // the official checkpoint stores it as fp8
  double init_mean = 0.0;
  double init_std = 1.0;

  std::string value_name() const { return kind == SlotKind::param ? key : key + ".weight"; }
  std::string scale_name() const { return key + ".scale"; }
  bool grouped() const { return shape.size() == 3; }
  GroupedRows group_rows() const { return {shape[0], shape[1]}; }
};

// Copies scale row `from` of `src` to row `to` of `dst` (rows of `cols` elements).
void copy_scale_row(const HostTensor& src, int64_t from, HostTensor& dst, int64_t to,
                    int64_t cols) {
  const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(src.dtype());
  std::memcpy(dst.data<uint8_t>() + to * row_bytes, src.data<uint8_t>() + from * row_bytes,
              row_bytes);
}

// Checkpoint grid [ceil(G*L/128), C] -> per-group grid [G, ceil(L/128), C].
HostTensor split_group_scales(const char* where, const std::string& name, const HostTensor& stacked,
                              GroupedRows gr) {
  const int64_t cols = stacked.shape().back();
  HostTensor out(stacked.dtype(), {gr.groups, gr.group_blocks(), cols});
  for (int64_t g = 0; g < gr.groups; ++g)
    for (int64_t b = 0; b < gr.group_blocks(); ++b)
      copy_scale_row(stacked, gr.stacked_block(where, name, g, b), out, g * gr.group_blocks() + b,
                     cols);
  return out;
}

// Per-group grid -> checkpoint grid; per-group blocks sharing a checkpoint block must agree.
HostTensor stack_group_scales(const char* where, const std::string& name, const HostTensor& split,
                              GroupedRows gr) {
  const int64_t cols = split.shape().back();
  const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(split.dtype());
  HostTensor out(split.dtype(),
                 {(gr.groups * gr.rows + kWeightScaleBlock - 1) / kWeightScaleBlock, cols});
  std::vector<bool> written(static_cast<size_t>(out.shape()[0]), false);
  for (int64_t g = 0; g < gr.groups; ++g)
    for (int64_t b = 0; b < gr.group_blocks(); ++b) {
      const int64_t row = gr.stacked_block(where, name, g, b);
      const int64_t from = g * gr.group_blocks() + b;
      if (!written[static_cast<size_t>(row)]) {
        copy_scale_row(split, from, out, row, cols);
        written[static_cast<size_t>(row)] = true;
      } else if (std::memcmp(out.data<uint8_t>() + row * row_bytes,
                             split.data<uint8_t>() + from * row_bytes, row_bytes) != 0) {
        fail(where, ": ", name, ": groups sharing checkpoint scale block row ", row,
             " have different scales; the checkpoint format cannot hold them");
      }
    }
  return out;
}

int layer_ratio(const ModelConfig& cfg, int layer, const char* where) {
  if (cfg.family != "v4")
    fail(where, ": config '", cfg.name, "' is family ", cfg.family,
         "; only DeepSeek-V4 attention weights are supported");
  if (layer < 0 || layer >= cfg.n_layers())
    fail_expected(where, "layer", "0.." + std::to_string(cfg.n_layers() - 1), layer);
  return cfg.compress_ratios[static_cast<size_t>(layer)];
}

// Slot makers. Linear weights start N(0, 1/fan_in) (fan_in = the checkpoint matrix's columns),
// norms 1 + N(0, 0.05^2); `fp8` marks weights the official checkpoint stores in fp8.
Slot linear_slot(std::string key, Weight& w, Shape shape, Shape stored, bool fp8) {
  Slot s{std::move(key), SlotKind::linear, &w, nullptr, std::move(shape), std::move(stored)};
  s.fp8_in_checkpoint = fp8;
  s.init_std = 1.0 / std::sqrt(static_cast<double>(s.stored_shape[1]));
  return s;
}
Slot linear_slot(std::string key, Weight& w, Shape shape, bool fp8) {
  Shape stored = shape;
  return linear_slot(std::move(key), w, std::move(shape), std::move(stored), fp8);
}
Slot norm_slot(std::string key, HostTensor& t, int64_t dim) {
  Slot s{std::move(key), SlotKind::norm, nullptr, &t, {dim}, {dim}};
  s.init_mean = 1.0;
  s.init_std = 0.05;
  return s;
}
Slot param_slot(std::string key, HostTensor& t, Shape shape, double init_std) {
  Slot s{std::move(key), SlotKind::param, nullptr, &t, shape, shape};
  s.init_std = init_std;
  return s;
}

void add_compressor_slots(std::vector<Slot>& slots, CompressorWeights& c, const std::string& key,
                          int64_t head_dim, int ratio, int64_t dim) {
  const int64_t width = (ratio == 4 ? 2 : 1) * head_dim;  // coff * head_dim
  slots.push_back(linear_slot(key + ".wkv", c.wkv, {width, dim}, false));
  slots.push_back(linear_slot(key + ".wgate", c.wgate, {width, dim}, false));
  slots.push_back(param_slot(key + ".ape", c.ape, {ratio, width}, 0.5));
  slots.push_back(norm_slot(key + ".norm", c.norm, head_dim));
}

// The layer's tensors, pointing into `w`. Creates (or drops) the optional compressor and indexer
// to match the layer's ratio, so `w` must already have been checked where that matters.
std::vector<Slot> layer_slots(AttentionWeights& w, const ModelConfig& cfg) {
  const int64_t dim = cfg.dim, heads = cfg.n_heads, hd = cfg.head_dim, q_lora = cfg.q_lora_rank;
  const int64_t groups = cfg.o_groups, o_lora = cfg.o_lora_rank;
  const int64_t group_in = groups > 0 ? heads * hd / groups : 0;
  std::vector<Slot> s;
  s.push_back(linear_slot("wq_a", w.wq_a, {q_lora, dim}, true));
  s.push_back(norm_slot("q_norm", w.q_norm, q_lora));
  s.push_back(linear_slot("wq_b", w.wq_b, {heads * hd, q_lora}, true));
  s.push_back(linear_slot("wkv", w.wkv, {hd, dim}, true));
  s.push_back(norm_slot("kv_norm", w.kv_norm, hd));
  s.push_back(
      linear_slot("wo_a", w.wo_a, {groups, o_lora, group_in}, {groups * o_lora, group_in}, true));
  s.push_back(linear_slot("wo_b", w.wo_b, {dim, groups * o_lora}, true));
  s.push_back(param_slot("attn_sink", w.attn_sink, {heads}, 1.0));

  if (w.compress_ratio > 0) {
    if (!w.compressor) w.compressor.emplace();
    add_compressor_slots(s, *w.compressor, "compressor", hd, w.compress_ratio, dim);
  } else {
    w.compressor.reset();
  }
  if (w.compress_ratio == 4) {
    if (!w.indexer) w.indexer.emplace();
    IndexerWeights& ix = *w.indexer;
    const int64_t ih = cfg.index_n_heads, id = cfg.index_head_dim;
    s.push_back(linear_slot("indexer.wq_b", ix.wq_b, {ih * id, q_lora}, true));
    s.push_back(linear_slot("indexer.weights_proj", ix.weights_proj, {ih, dim}, false));
    add_compressor_slots(s, ix.compressor, "indexer.compressor", id, 4, dim);
  } else {
    w.indexer.reset();
  }
  return s;
}

// ---- shape / dtype rules --------------------------------------------------------------------

bool allowed_dtype(SlotKind kind, DType t) {
  switch (kind) {
    case SlotKind::linear:
      return t == DType::fp8_e4m3 || t == DType::bf16 || t == DType::fp16 || t == DType::fp32;
    case SlotKind::norm:
      return t == DType::bf16 || t == DType::fp32;
    case SlotKind::param:
      return t == DType::fp32;
  }
  return false;
}

const char* allowed_dtypes_text(SlotKind kind) {
  switch (kind) {
    case SlotKind::linear:
      return "F8_E4M3 (with a .scale), BF16, F16 or F32";
    case SlotKind::norm:
      return "BF16 or F32";
    case SlotKind::param:
      return "F32";
  }
  return "?";
}

void check_entry(const char* where, const std::string& name, const Shape& shape, DType dtype,
                 const Shape& want_shape, SlotKind kind) {
  if (shape != want_shape)
    fail_expected(where, name + " shape", shape_text(want_shape), shape_text(shape));
  if (!allowed_dtype(kind, dtype))
    fail_expected(where, name + " dtype", allowed_dtypes_text(kind), safetensors_dtype_name(dtype));
}

void check_scale(const char* where, const std::string& name, const Shape& shape, DType dtype,
                 const Shape& want_shape) {
  if (shape != want_shape)
    fail_expected(where, name + " shape", shape_text(want_shape) + " (one per 128x128 block)",
                  shape_text(shape));
  if (dtype != DType::ue8m0 && dtype != DType::fp32)
    fail_expected(where, name + " dtype", "F8_E8M0 or F32", safetensors_dtype_name(dtype));
}

Shape shape_of(const HostTensor& t) { return t.shape(); }

// A copy of `t` with another shape of the same element count (wo_a: 2-d <-> 3-d).
HostTensor with_shape(const HostTensor& t, const Shape& shape) {
  if (t.shape() == shape) return t;
  HostTensor out(t.dtype(), shape);
  DSV4_CHECK(out.numel() == t.numel(), "with_shape: ", shape_text(t.shape()), " -> ",
             shape_text(shape), " changes the element count");
  if (t.nbytes() > 0) std::memcpy(out.data<uint8_t>(), t.data<uint8_t>(), t.nbytes());
  return out;
}

// A linear slot's in-memory scale from its checkpoint scale, and back (differs for wo_a only).
HostTensor scale_from_checkpoint(const char* where, const std::string& name, const Slot& slot,
                                 const HostTensor& stored) {
  return slot.grouped() ? split_group_scales(where, name, stored, slot.group_rows()) : stored;
}
HostTensor scale_to_checkpoint(const char* where, const std::string& name, const Slot& slot,
                               const HostTensor& scale) {
  return slot.grouped() ? stack_group_scales(where, name, scale, slot.group_rows()) : scale;
}

// ---- deterministic random numbers -----------------------------------------------------------

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Approximately N(0, 1) as the sum of 4 uniforms (Irwin-Hall), the four 16-bit quarters of one
// 64-bit draw: only exact integer and IEEE arithmetic, so every platform generates the same
// numbers (no libm), and fast enough for full-size layers. 16-bit resolution is far finer than
// the bf16 / fp8 weights it becomes.
double normal01(uint64_t& state) {
  const uint64_t bits = splitmix64(state);
  double sum = 0.0;
  for (int i = 0; i < 4; ++i) sum += static_cast<double>((bits >> (16 * i)) & 0xffffu) + 0.5;
  return (sum * 0x1.0p-16 - 2.0) * 1.7320508075688772;  // variance 4/12 -> 1
}

// Each row has its own stream (seeded by seed, layer, tensor and row), so rows fill in parallel
// and the bytes do not depend on the thread count.
HostTensor random_tensor(const Slot& slot, uint64_t seed, int layer) {
  const uint64_t tensor_seed =
      seed ^ fnv1a(slot.key) ^ (0x51ed2701a3b4c5d7ull * static_cast<uint64_t>(layer + 1));
  HostTensor t(DType::fp32, slot.stored_shape);
  const int64_t cols = slot.stored_shape.back();
  const int64_t rows = cols > 0 ? t.numel() / cols : 0;
  float* p = t.data<float>();
#pragma omp parallel for schedule(static) if (t.numel() >= weights_detail::kParallelMinElements)
  for (int64_t r = 0; r < rows; ++r) {
    uint64_t state = tensor_seed ^ (0xd1b54a32d192ed03ull * static_cast<uint64_t>(r + 1));
    splitmix64(state);  // decorrelate nearby seeds
    for (int64_t c = 0; c < cols; ++c)
      p[r * cols + c] = static_cast<float>(slot.init_mean + slot.init_std * normal01(state));
  }
  return t;
}

// bf16 copy of an fp32 tensor.
HostTensor to_bf16(const HostTensor& t) {
  HostTensor out(DType::bf16, t.shape());
  const float* src = t.data<float>();
  uint16_t* dst = out.data<uint16_t>();
#pragma omp parallel for schedule(static) if (t.numel() >= weights_detail::kParallelMinElements)
  for (int64_t i = 0; i < t.numel(); ++i) dst[i] = float_to_bf16_bits(src[i]);
  return out;
}

// ---- checkpoint names -----------------------------------------------------------------------

// Prefixes a checkpoint may use for the layer, the official one first.
std::vector<std::string> prefix_candidates(const ModelConfig& cfg, int layer) {
  std::vector<std::string> out{attention_tensor_prefix(cfg, layer)};
  const int n_main = cfg.n_layers() - cfg.n_mtp_layers;
  if (layer < n_main) {
    const std::string i = std::to_string(layer);
    out.push_back("model.layers." + i + ".self_attn.");
    out.push_back("model.layers." + i + ".attn.");
  }
  return out;
}

// ---- tensor sources ---------------------------------------------------------------------------

class CheckpointSource final : public TensorSource {
 public:
  explicit CheckpointSource(const Checkpoint& ckpt) : ckpt_(ckpt) {}
  bool contains(const std::string& name) const override { return ckpt_.contains(name); }
  Info info(const std::string& name) const override {
    const SafetensorsEntry& e = ckpt_.entry(name);
    return {e.dtype, e.shape};
  }
  HostTensor read(const std::string& name) const override { return ckpt_.read(name); }
  std::string description() const override { return "checkpoint '" + ckpt_.directory() + "'"; }

 private:
  const Checkpoint& ckpt_;
};

class TensorMapSource final : public TensorSource {
 public:
  explicit TensorMapSource(const TensorMap& tensors) : tensors_(tensors) {}
  bool contains(const std::string& name) const override { return tensors_.count(name) != 0; }
  Info info(const std::string& name) const override {
    const HostTensor& t = tensors_.at(name);
    return {t.dtype(), t.shape()};
  }
  HostTensor read(const std::string& name) const override { return tensors_.at(name); }
  std::string description() const override { return "the tensor map"; }

 private:
  const TensorMap& tensors_;
};

}  // namespace

std::string attention_tensor_prefix(const ModelConfig& cfg, int layer) {
  layer_ratio(cfg, layer, "attention_tensor_prefix");
  const int n_main = cfg.n_layers() - cfg.n_mtp_layers;
  if (layer >= n_main) return "mtp." + std::to_string(layer - n_main) + ".attn.";
  return "layers." + std::to_string(layer) + ".attn.";
}

std::vector<std::string> attention_tensor_names(const AttentionWeights& w, const ModelConfig& cfg) {
  TensorMap tensors;
  add_attention_tensors(w, cfg, tensors);
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors) names.push_back(name);
  return names;
}

AttentionWeights random_attention_weights(const ModelConfig& cfg, int layer, uint64_t seed,
                                          bool fp8) {
  AttentionWeights w;
  w.layer = layer;
  w.compress_ratio = layer_ratio(cfg, layer, "random_attention_weights");
  for (const Slot& slot : layer_slots(w, cfg)) {
    const HostTensor values = random_tensor(slot, seed, layer);
    switch (slot.kind) {
      case SlotKind::linear:
        if (fp8 && slot.fp8_in_checkpoint) {
          Weight q = quantize_weight_fp8(values);
          slot.weight->value = with_shape(q.value, slot.shape);
          slot.weight->scale =
              scale_from_checkpoint("random_attention_weights", slot.scale_name(), slot, q.scale);
        } else {
          slot.weight->value = with_shape(to_bf16(values), slot.shape);
          slot.weight->scale = HostTensor();
        }
        break;
      case SlotKind::norm:
        *slot.tensor = to_bf16(values);
        break;
      case SlotKind::param:
        *slot.tensor = values;
        break;
    }
  }
  return w;
}

void validate_attention_weights(const AttentionWeights& w, const ModelConfig& cfg,
                                const char* where) {
  const int ratio = layer_ratio(cfg, w.layer, where);
  if (w.compress_ratio != ratio)
    fail_expected(where, "compress_ratio of layer " + std::to_string(w.layer), ratio,
                  w.compress_ratio);
  if (w.compressor.has_value() != (ratio > 0))
    fail(where, ": layer ", w.layer, " (ratio ", ratio, "): compressor weights ",
         ratio > 0 ? "missing" : "present but the layer does not compress");
  if (w.indexer.has_value() != (ratio == 4))
    fail(where, ": layer ", w.layer, " (ratio ", ratio, "): indexer weights ",
         ratio == 4 ? "missing" : "present but only ratio-4 layers have an indexer");

  AttentionWeights view = w;  // shares the buffers; layer_slots needs a mutable object
  const std::string prefix = attention_tensor_prefix(cfg, w.layer);
  for (const Slot& slot : layer_slots(view, cfg)) {
    const std::string name = prefix + slot.value_name();
    const HostTensor& value = slot.kind == SlotKind::linear ? slot.weight->value : *slot.tensor;
    if (!value.view().defined()) fail(where, ": ", name, ": missing");
    check_entry(where, name, shape_of(value), value.dtype(), slot.shape, slot.kind);
    if (slot.kind != SlotKind::linear) continue;
    const bool fp8 = value.dtype() == DType::fp8_e4m3;
    const Weight& weight = *slot.weight;
    if (fp8 && !weight.quantized())
      fail(where, ": ", prefix + slot.scale_name(), ": missing (", name, " is fp8)");
    if (!fp8 && weight.quantized())
      fail(where, ": ", prefix + slot.scale_name(), ": present but ", name, " is ",
           safetensors_dtype_name(value.dtype()), " (only fp8 weights have scales)");
    if (fp8)
      check_scale(where, prefix + slot.scale_name(), shape_of(weight.scale), weight.scale.dtype(),
                  weight_scale_shape(slot.shape));
  }
}

AttentionWeights load_attention_weights(const Checkpoint& ckpt, const ModelConfig& cfg, int layer) {
  return load_attention_weights(CheckpointSource(ckpt), cfg, layer);
}

AttentionWeights load_attention_weights(const TensorMap& tensors, const ModelConfig& cfg,
                                        int layer) {
  return load_attention_weights(TensorMapSource(tensors), cfg, layer);
}

AttentionWeights load_attention_weights(const TensorSource& source, const ModelConfig& cfg,
                                        int layer) {
  const char* where = "load_attention_weights";
  AttentionWeights w;
  w.layer = layer;
  w.compress_ratio = layer_ratio(cfg, layer, where);

  // The naming style: the first candidate prefix under which the layer's wq_a exists.
  const std::vector<std::string> prefixes = prefix_candidates(cfg, layer);
  std::string prefix = prefixes.front();
  for (const std::string& p : prefixes)
    if (source.contains(p + "wq_a.weight")) {
      prefix = p;
      break;
    }
  auto missing = [&](const std::string& name, const std::string& expected) {
    fail(where, ": missing tensor '", name, "' (expected ", expected, ") in ",
         source.description());
  };

  for (const Slot& slot : layer_slots(w, cfg)) {
    const std::string name = prefix + slot.value_name();
    if (!source.contains(name))
      missing(name, shape_text(slot.stored_shape) + " " + allowed_dtypes_text(slot.kind));
    const TensorSource::Info e = source.info(name);
    check_entry(where, name, e.shape, e.dtype, slot.stored_shape, slot.kind);
    if (slot.kind != SlotKind::linear) {
      *slot.tensor = source.read(name);
      continue;
    }
    // Scales: "<key>.scale" (official), "<key>.weight_scale_inv" (transformers spelling).
    std::string scale_name = prefix + slot.scale_name();
    if (!source.contains(scale_name) && source.contains(prefix + slot.key + ".weight_scale_inv"))
      scale_name = prefix + slot.key + ".weight_scale_inv";
    const bool fp8 = e.dtype == DType::fp8_e4m3;
    const bool has_scale = source.contains(scale_name);
    if (fp8 && !has_scale)
      missing(scale_name, shape_text(weight_scale_shape(slot.stored_shape)) +
                              " F8_E8M0 or F32 block scales of the fp8 weight " + name);
    if (!fp8 && has_scale)
      fail(where, ": ", scale_name, ": present but ", name, " is ", safetensors_dtype_name(e.dtype),
           " (only fp8 weights have scales)");
    slot.weight->value = with_shape(source.read(name), slot.shape);
    if (fp8) {
      const TensorSource::Info s = source.info(scale_name);
      check_scale(where, scale_name, s.shape, s.dtype, weight_scale_shape(slot.stored_shape));
      slot.weight->scale = scale_from_checkpoint(where, scale_name, slot, source.read(scale_name));
    }
  }
  validate_attention_weights(w, cfg, where);
  return w;
}

void add_attention_tensors(const AttentionWeights& w, const ModelConfig& cfg, TensorMap& out) {
  validate_attention_weights(w, cfg, "add_attention_tensors");
  AttentionWeights view = w;
  const std::string prefix = attention_tensor_prefix(cfg, w.layer);
  for (const Slot& slot : layer_slots(view, cfg)) {
    if (slot.kind != SlotKind::linear) {
      out[prefix + slot.value_name()] = *slot.tensor;
      continue;
    }
    out[prefix + slot.value_name()] = with_shape(slot.weight->value, slot.stored_shape);
    if (slot.weight->quantized())
      out[prefix + slot.scale_name()] = scale_to_checkpoint(
          "add_attention_tensors", prefix + slot.scale_name(), slot, slot.weight->scale);
  }
}

void save_attention_weights(const std::string& path, const ModelConfig& cfg,
                            const std::vector<AttentionWeights>& layers,
                            const MetadataMap& metadata) {
  TensorMap tensors;
  for (const AttentionWeights& w : layers) add_attention_tensors(w, cfg, tensors);
  write_safetensors(path, tensors, metadata);
}

}  // namespace dsv4
