// A layer's weights as a table of slots (checkpoint name, shape, dtype rules, init), and the
// table-driven operations every weight set shares: random generation, validation, loading from a
// TensorSource and adding to a TensorMap. A weight set (V4's AttentionWeights, V3.2's
// SparseMlaWeights) only lists its slots, so its four operations cannot drift apart.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsv4/safetensors.h"
#include "dsv4/tensor.h"
#include "dsv4/weights.h"

namespace dsv4::weights_detail {

using Shape = std::vector<int64_t>;

// wo_a's scales: in memory one grid per group ([G, ceil(L/128), ceil(K/128)], what grouped_wo_a
// takes), in the checkpoint one grid over the stacked [G*L, K] matrix. Each per-group 128-row
// block must lie inside one checkpoint 128-row block for the two to describe the same weight:
// true when L % 128 == 0 (every released model) or 128 % L == 0 (tiny test configs).
struct GroupedRows {
  int64_t groups;
  int64_t rows;  // L, rows per group

  int64_t group_blocks() const { return (rows + kWeightScaleBlock - 1) / kWeightScaleBlock; }
  // The checkpoint row block holding per-group block (g, b); throws when it straddles two.
  int64_t stacked_block(const char* where, const std::string& name, int64_t g, int64_t b) const;
};

enum class SlotKind : uint8_t {
  linear,  // Weight: "<key>.weight" (+ "<key>.scale" when fp8)
  norm,    // norm weight or bias: "<key><suffix>", bf16 or fp32
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
  std::string suffix = ".weight";  // norm slots: ".weight", or ".bias" for a LayerNorm's bias

  std::string value_name() const { return kind == SlotKind::param ? key : key + suffix; }
  std::string scale_name() const { return key + ".scale"; }
  bool grouped() const { return shape.size() == 3; }
  GroupedRows group_rows() const { return {shape[0], shape[1]}; }
};

// Slot makers. Linear weights start N(0, 1/fan_in) (fan_in = the checkpoint matrix's columns),
// norms 1 + N(0, 0.05^2), biases N(0, 0.05^2); `fp8` marks weights the official checkpoint stores
// in fp8.
Slot linear_slot(std::string key, Weight& w, Shape shape, Shape stored, bool fp8);
Slot linear_slot(std::string key, Weight& w, Shape shape, bool fp8);
Slot norm_slot(std::string key, HostTensor& t, int64_t dim);
Slot bias_slot(std::string key, HostTensor& t, int64_t dim);
Slot param_slot(std::string key, HostTensor& t, Shape shape, double init_std);

// Fills every slot with deterministic random values (same (seed, layer, key), same bytes on every
// platform); `fp8`: the slots the checkpoint stores in fp8 become fp8 with ue8m0 block scales, the
// other linear weights and norms bf16, params fp32.
void fill_random_slots(const std::vector<Slot>& slots, uint64_t seed, int layer, bool fp8,
                       const char* where);
// Presence, shape and dtype of every slot (scales included); names are prefix + slot name.
void validate_slots(const std::vector<Slot>& slots, const std::string& prefix, const char* where);
// Reads every slot from `source` under prefix + its name ("<key>.scale" or the transformers
// spelling "<key>.weight_scale_inv" for fp8 scales), checking shapes and dtypes first.
void load_slots(const TensorSource& source, const std::vector<Slot>& slots,
                const std::string& prefix, const char* where);
// Adds every slot under prefix + its checkpoint name, in its checkpoint shape.
void add_slot_tensors(const std::vector<Slot>& slots, const std::string& prefix, TensorMap& out,
                      const char* where);
// The first of `prefixes` under which `source` holds prefix + probe (else the first prefix): the
// naming style of the checkpoint.
std::string pick_prefix(const TensorSource& source, const std::vector<std::string>& prefixes,
                        const std::string& probe);

// TensorSource adapters.
class CheckpointSource final : public TensorSource {
 public:
  explicit CheckpointSource(const Checkpoint& ckpt) : ckpt_(ckpt) {}
  bool contains(const std::string& name) const override { return ckpt_.contains(name); }
  Info info(const std::string& name) const override;
  HostTensor read(const std::string& name) const override { return ckpt_.read(name); }
  std::string description() const override;

 private:
  const Checkpoint& ckpt_;
};

class TensorMapSource final : public TensorSource {
 public:
  explicit TensorMapSource(const TensorMap& tensors) : tensors_(tensors) {}
  bool contains(const std::string& name) const override { return tensors_.count(name) != 0; }
  Info info(const std::string& name) const override;
  HostTensor read(const std::string& name) const override { return tensors_.at(name); }
  std::string description() const override { return "the tensor map"; }

 private:
  const TensorMap& tensors_;
};

}  // namespace dsv4::weights_detail
