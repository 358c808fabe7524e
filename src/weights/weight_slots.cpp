// The table-driven operations on weight slots (see weight_slots.h).
#include "weights/weight_slots.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "weights/weights_detail.h"

namespace dsv4::weights_detail {

namespace {

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

}  // namespace

int64_t GroupedRows::stacked_block(const char* where, const std::string& name, int64_t g,
                                   int64_t b) const {
  const int64_t first = g * rows + b * kWeightScaleBlock;
  const int64_t last = g * rows + std::min(rows, (b + 1) * kWeightScaleBlock) - 1;
  if (first / kWeightScaleBlock != last / kWeightScaleBlock)
    fail(where, ": ", name, ": groups of ", rows,
         " rows straddle the checkpoint's 128-row scale blocks (per-group scales need rows "
         "per group to be a multiple or a divisor of 128)");
  return first / kWeightScaleBlock;
}

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
Slot bias_slot(std::string key, HostTensor& t, int64_t dim) {
  Slot s{std::move(key), SlotKind::norm, nullptr, &t, {dim}, {dim}};
  s.init_std = 0.05;
  s.suffix = ".bias";
  return s;
}

void fill_random_slots(const std::vector<Slot>& slots, uint64_t seed, int layer, bool fp8,
                       const char* where) {
  for (const Slot& slot : slots) {
    const HostTensor values = random_tensor(slot, seed, layer);
    switch (slot.kind) {
      case SlotKind::linear:
        if (fp8 && slot.fp8_in_checkpoint) {
          Weight q = quantize_weight_fp8(values);
          slot.weight->value = with_shape(q.value, slot.shape);
          slot.weight->scale = scale_from_checkpoint(where, slot.scale_name(), slot, q.scale);
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
}

void validate_slots(const std::vector<Slot>& slots, const std::string& prefix, const char* where) {
  for (const Slot& slot : slots) {
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

void load_slots(const TensorSource& source, const std::vector<Slot>& slots,
                const std::string& prefix, const char* where) {
  auto missing = [&](const std::string& name, const std::string& expected) {
    fail(where, ": missing tensor '", name, "' (expected ", expected, ") in ",
         source.description());
  };
  for (const Slot& slot : slots) {
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
}

void add_slot_tensors(const std::vector<Slot>& slots, const std::string& prefix, TensorMap& out,
                      const char* where) {
  for (const Slot& slot : slots) {
    if (slot.kind != SlotKind::linear) {
      out[prefix + slot.value_name()] = *slot.tensor;
      continue;
    }
    out[prefix + slot.value_name()] = with_shape(slot.weight->value, slot.stored_shape);
    if (slot.weight->quantized())
      out[prefix + slot.scale_name()] =
          scale_to_checkpoint(where, prefix + slot.scale_name(), slot, slot.weight->scale);
  }
}

std::string pick_prefix(const TensorSource& source, const std::vector<std::string>& prefixes,
                        const std::string& probe) {
  for (const std::string& p : prefixes)
    if (source.contains(p + probe)) return p;
  return prefixes.front();
}

TensorSource::Info CheckpointSource::info(const std::string& name) const {
  const SafetensorsEntry& e = ckpt_.entry(name);
  return {e.dtype, e.shape};
}
std::string CheckpointSource::description() const {
  return "checkpoint '" + ckpt_.directory() + "'";
}

TensorSource::Info TensorMapSource::info(const std::string& name) const {
  const HostTensor& t = tensors_.at(name);
  return {t.dtype(), t.shape()};
}

}  // namespace dsv4::weights_detail
