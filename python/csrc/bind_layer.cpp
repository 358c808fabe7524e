// Bindings of the whole attention layer: dsv4::Attention (include/dsv4/layer.h), its weights
// (weights.h: random, from a checkpoint, from a torch state dict; saved under the official names)
// and the float64 reference layer (reference.h) the tests judge it by. The layer runs on the CPU
// or on CUDA (backend="cuda"); tensors cross the boundary by DLPack (x, y) or by copy (weights).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "dsv4/batch.h"
#include "dsv4/config.h"
#include "dsv4/layer.h"
#include "dsv4/model.h"
#include "dsv4/reference.h"
#include "dsv4/safetensors.h"
#include "dsv4/weights.h"
#include "tensor_args.h"

namespace dsv4::python {

namespace {

using nb::arg;
using Release = nb::call_guard<nb::gil_scoped_release>;
using StateDict = std::map<std::string, AnyArray>;

// A torch state dict as the weight loader's TensorSource. Tensors are looked at lazily, so the
// dict may hold a whole model (other layers, experts in dtypes the layer never takes).
class StateDictSource final : public TensorSource {
 public:
  explicit StateDictSource(const StateDict& tensors) : tensors_(tensors) {}
  bool contains(const std::string& name) const override { return tensors_.count(name) != 0; }
  Info info(const std::string& name) const override {
    const TensorView v = view_of(tensors_.at(name), name.c_str());
    return {v.dtype, std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.ndim)};
  }
  HostTensor read(const std::string& name) const override {
    return host_copy(tensors_.at(name), name.c_str());
  }
  std::string description() const override { return "the state dict"; }

 private:
  const StateDict& tensors_;
};

// Weights loaded for `layer` must be the layer's own (validate_attention_weights checks them
// against the layer they name, not the one they are used for).
void check_weights_for(const char* where, const AttentionWeights& w, const ModelConfig& cfg,
                       int layer) {
  if (w.layer != layer)
    fail_expected(where, "weights.layer", layer, w.layer);
  validate_attention_weights(w, cfg, where);
}

nb::dict tensors_of(const AttentionWeights& w, const ModelConfig& cfg) {
  TensorMap tensors;
  add_attention_tensors(w, cfg, tensors);
  nb::dict out;
  for (const auto& [name, t] : tensors) out[nb::str(name.c_str())] = torch_copy(t);
  return out;
}

void bind_weights(nb::module_& m) {
  nb::class_<AttentionWeights>(
      m, "AttentionWeights",
      "The weights of one attention layer (include/dsv4/weights.h), held in C++. Official "
      "checkpoint names: tensor_names(config); torch copies: tensors(config).")
      .def_static("random", &random_attention_weights, arg("config"), arg("layer"),
                  arg("seed") = 1, arg("fp8") = true,
                  "Deterministic random weights (fp8: FP8 e4m3 + UE8M0 block scales where the "
                  "released checkpoints store FP8, else bf16)")
      .def_static(
          "from_checkpoint",
          [](const std::string& path, const ModelConfig& cfg, int layer) {
            return load_attention_weights(Checkpoint::open(path), cfg, layer);
          },
          arg("path"), arg("config"), arg("layer"),
          "The layer's tensors of a checkpoint (a directory of *.safetensors, with or without "
          "model.safetensors.index.json, or one .safetensors file)")
      .def_static(
          "from_state_dict",
          [](const StateDict& tensors, const ModelConfig& cfg, int layer) {
            return load_attention_weights(StateDictSource(tensors), cfg, layer);
          },
          arg("tensors"), arg("config"), arg("layer"),
          "The layer's tensors of a {name: tensor} dict under the checkpoint names (copied)")
      .def_ro("layer", &AttentionWeights::layer)
      .def_ro("compress_ratio", &AttentionWeights::compress_ratio)
      .def(
          "tensor_names",
          [](const AttentionWeights& w, const ModelConfig& cfg) {
            return attention_tensor_names(w, cfg);
          },
          arg("config"), "The checkpoint names of these weights' tensors, sorted")
      .def("tensors", &tensors_of, arg("config"),
           "{checkpoint name: CPU torch tensor} (copies; wo_a as the checkpoint's 2-d matrix)")
      .def(
          "save",
          [](const AttentionWeights& w, const std::string& path, const ModelConfig& cfg) {
            save_attention_weights(path, cfg, {w});
          },
          arg("path"), arg("config"), "Writes the tensors to one .safetensors file")
      .def("__repr__", [](const AttentionWeights& w) {
        return "<dsv4attn.AttentionWeights layer " + std::to_string(w.layer) + ", ratio " +
               std::to_string(w.compress_ratio) + ">";
      });
}

// ---- the layer --------------------------------------------------------------------------------

Attention make_attention(const ModelConfig& cfg, int layer, const AttentionWeights& w,
                         int32_t swa_blocks, int32_t compressed_blocks, int32_t state_blocks,
                         int swa_block_size, bool fp8_activations, const std::string& backend) {
  check_weights_for("Attention", w, cfg, layer);
  AttentionOptions opts;
  if (backend != "cpu" && backend != "cuda")
    fail_expected("Attention", "backend", "cpu or cuda", backend);
  opts.backend = backend == "cuda" ? Backend::cuda : Backend::cpu;
  opts.caches.swa_blocks = swa_blocks;
  opts.caches.compressed_blocks = compressed_blocks;
  opts.caches.state_blocks = state_blocks;
  opts.caches.swa_block_size = swa_block_size;
  opts.fp8_activations = fp8_activations;  // Python's flag covers every FP8 activation quantization
  opts.fp8_gemm_activations = fp8_activations;
  return Attention(cfg, layer, w, opts);
}

// Copies `rows` rows starting at row `from` of src to row `to` of dst (contiguous [T, dim]).
void copy_rows(const TensorView& src, int64_t from, const TensorView& dst, int64_t to,
               int64_t rows) {
  const size_t row_bytes = static_cast<size_t>(src.shape[1]) * dtype_size(src.dtype);
  std::memcpy(static_cast<uint8_t*>(dst.data) + to * row_bytes,
              static_cast<const uint8_t*>(src.data) + from * row_bytes, rows * row_bytes);
}

// One forward step. Requests may come in any order; x's and y's rows follow that order (request
// i's tokens are rows [sum(num_new[:i]), sum(num_new[:i+1]))). The layer wants decodes first
// (BatchPlan::make): when the given order differs, x is gathered into plan order and the result
// scattered back, after the layer has accepted the batch (so a rejected batch leaves y alone).
// Layer: dsv4::Attention or dsv4::AttentionStack (forward(plan, x, y), config()).
template <class Layer>
void forward_op(Layer& layer, const std::vector<int64_t>& req_ids,
                const std::vector<int64_t>& contexts, const std::vector<int64_t>& num_new,
                const AnyArray& x_arr, const AnyArray& y_arr) {
  const char* where = std::is_same_v<Layer, Attention> ? "Attention.forward" : "AttentionStack.forward";
  DSV4_CHECK_EQ(where, "len(contexts) (one per request id)", req_ids.size(), contexts.size());
  DSV4_CHECK_EQ(where, "len(num_new) (one per request id)", req_ids.size(), num_new.size());
  std::vector<RequestStep> steps;
  for (size_t i = 0; i < req_ids.size(); ++i) steps.push_back({req_ids[i], contexts[i], num_new[i]});
  const BatchPlan plan = BatchPlan::make(steps);
  const TensorView x = view_of(x_arr, "x"), y = view_of(y_arr, "y");

  bool same_order = true;
  for (size_t i = 0; i < steps.size(); ++i) same_order &= plan.requests[i].req_id == req_ids[i];
  if (same_order) {
    layer.forward(plan, x, y);
    return;
  }
  // Both tensors are read row by row below: check what the copies rely on first.
  const int64_t T = plan.num_tokens(), dim = layer.config().dim;
  for (const auto& [name, t] : {std::pair{"x", x}, std::pair{"y", y}}) {
    check_device(where, name, t, Device::cpu);
    check_shape(where, name, t, {T, dim});
    check_contiguous(where, name, t);
  }
  check_dtype(where, "y", y, DType::fp32);
  std::map<int64_t, int64_t> given_start;  // request id -> its first row in x / y
  int64_t row = 0;
  for (const RequestStep& s : steps) {
    given_start[s.req_id] = row;
    row += s.num_new;
  }
  HostTensor x_plan(x.dtype, {T, dim}), y_plan(DType::fp32, {T, dim});
  for (int r = 0; r < plan.num_requests(); ++r)
    copy_rows(x, given_start[plan.requests[r].req_id], x_plan, plan.query_start_loc[r],
              plan.requests[r].num_new);
  layer.forward(plan, x_plan, y_plan);
  for (int r = 0; r < plan.num_requests(); ++r)
    copy_rows(y_plan, plan.query_start_loc[r], y, given_start[plan.requests[r].req_id],
              plan.requests[r].num_new);
}

void bind_attention(nb::module_& m) {
  nb::class_<Attention>(m, "Attention",
                        "One attention layer with its weights and paged caches (CPU or CUDA), "
                        "include/dsv4/layer.h. Not safe to call from two threads at once.")
      .def(
          "__init__",
          [](Attention* self, const ModelConfig& cfg, int layer, const AttentionWeights& w,
             int32_t swa_blocks, int32_t compressed_blocks, int32_t state_blocks,
             int swa_block_size, bool fp8_activations, const std::string& backend) {
            new (self) Attention(make_attention(cfg, layer, w, swa_blocks, compressed_blocks,
                                                state_blocks, swa_block_size, fp8_activations,
                                                backend));
          },
          arg("config"), arg("layer"), arg("weights"), arg("swa_blocks"),
          arg("compressed_blocks"), arg("state_blocks"), arg("swa_block_size"),
          arg("fp8_activations"), arg("backend") = "cpu")
      .def("forward", &forward_op<Attention>, arg("req_ids"), arg("contexts"), arg("num_new"), arg("x"),
           arg("y"), Release(),
           "x [T, dim] bf16/fp32 → y [T, dim] fp32 (CPU, contiguous); rows follow the given "
           "request order")
      .def("release", &Attention::release, arg("req_id"))
      .def(
          "set_stream",
          [](Attention& a, uintptr_t stream) { a.set_stream(reinterpret_cast<Stream>(stream)); },
          arg("stream"), "CUDA: the cudaStream_t (as an int) later forwards run on")
      .def_prop_ro("config", &Attention::config)
      .def_prop_ro("layer", &Attention::layer_index)
      .def_prop_ro("kind",
                   [](const Attention& a) { return std::string(layer_kind_name(a.kind())); })
      .def_prop_ro("weights", &Attention::weights);
}

// ---- the attention stack -----------------------------------------------------------------------

int checked_layer(const AttentionStack& s, int i) {
  if (i < 0 || i >= s.num_layers())
    fail_expected("AttentionStack", "layer position", "0.." + std::to_string(s.num_layers() - 1), i);
  return i;
}

void bind_stack(nb::module_& m) {
  nb::class_<AttentionStack>(m, "AttentionStack",
                             "The attention layers of a config (include/dsv4/model.h), each with "
                             "its own weights and caches, residually chained")
      .def(
          "__init__",
          [](AttentionStack* self, const ModelConfig& cfg, const std::vector<int>& layers,
             const std::string& weights_dir, uint64_t seed, bool fp8_weights, int32_t swa_blocks,
             int32_t compressed_blocks, int32_t state_blocks, bool fp8_activations,
             const std::string& backend) {
            StackOptions so;
            so.layers = layers;
            so.weights_dir = weights_dir;
            so.seed = seed;
            so.fp8_weights = fp8_weights;
            so.attention.caches.swa_blocks = swa_blocks;
            so.attention.caches.compressed_blocks = compressed_blocks;
            so.attention.caches.state_blocks = state_blocks;
            so.attention.fp8_activations = fp8_activations;
            so.attention.fp8_gemm_activations = fp8_activations;
            if (backend != "cpu" && backend != "cuda")
              fail_expected("AttentionStack", "backend", "cpu or cuda", backend);
            so.attention.backend = backend == "cuda" ? Backend::cuda : Backend::cpu;
            new (self) AttentionStack(cfg, so);
          },
          arg("config"), arg("layers"), arg("weights_dir"), arg("seed"), arg("fp8_weights"),
          arg("swa_blocks"), arg("compressed_blocks"), arg("state_blocks"),
          arg("fp8_activations"), arg("backend"))
      .def("forward", &forward_op<AttentionStack>, arg("req_ids"), arg("contexts"),
           arg("num_new"), arg("x"), arg("y"), Release(),
           "x [T, dim] fp32 → y [T, dim] fp32 (CPU, contiguous); rows follow the given order")
      .def("release", &AttentionStack::release, arg("req_id"))
      .def_prop_ro("num_layers", &AttentionStack::num_layers)
      .def(
          "layer_index", [](AttentionStack& s, int i) { return s.layer(checked_layer(s, i)).layer_index(); },
          arg("i"))
      .def(
          "layer_kind",
          [](AttentionStack& s, int i) {
            return std::string(layer_kind_name(s.layer(checked_layer(s, i)).kind()));
          },
          arg("i"));
}

// ---- the float64 reference ----------------------------------------------------------------------

using HostF64 = nb::ndarray<const double, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

nb::ndarray<nb::pytorch, double> reference_op(const ModelConfig& cfg, int layer,
                                              const AttentionWeights& w, const HostF64& x,
                                              bool fp8_activations) {
  const char* where = "reference_attention_layer";
  check_weights_for(where, w, cfg, layer);
  DSV4_CHECK_EQ(where, "x.shape[1] (dim)", static_cast<size_t>(cfg.dim), x.shape(1));
  const std::vector<double> xs(x.data(), x.data() + x.size());
  auto y = std::make_unique<std::vector<double>>();
  {
    nb::gil_scoped_release release;
    *y = reference_attention_layer(cfg, layer, w, xs, ReferenceOptions{fp8_activations, fp8_activations});
  }
  double* data = y->data();
  nb::capsule owner(y.release(),
                    [](void* p) noexcept { delete static_cast<std::vector<double>*>(p); });
  const size_t shape[2] = {x.shape(0), x.shape(1)};
  return nb::ndarray<nb::pytorch, double>(data, 2, shape, owner);
}

}  // namespace

void bind_layer(nb::module_& m) {
  bind_stack(m);
  m.def(
      "plan_order",
      [](const std::vector<int64_t>& req_ids, const std::vector<int64_t>& contexts,
         const std::vector<int64_t>& num_new) {
        DSV4_CHECK_EQ("plan_order", "len(contexts)", req_ids.size(), contexts.size());
        DSV4_CHECK_EQ("plan_order", "len(num_new)", req_ids.size(), num_new.size());
        std::vector<RequestStep> steps;
        for (size_t i = 0; i < req_ids.size(); ++i) steps.push_back({req_ids[i], contexts[i], num_new[i]});
        const BatchPlan plan = BatchPlan::make(steps);
        std::map<int64_t, int> given;
        for (size_t i = 0; i < req_ids.size(); ++i) given[req_ids[i]] = static_cast<int>(i);
        std::vector<int> order;
        for (const RequestStep& s : plan.requests) order.push_back(given[s.req_id]);
        return order;
      },
      arg("req_ids"), arg("contexts"), arg("num_new"),
      "The order the layer runs requests in (decodes first): indices into the given lists");
  bind_weights(m);
  bind_attention(m);
  m.def("reference_attention_layer", &reference_op, arg("config"), arg("layer"), arg("weights"),
        arg("x"), arg("fp8_activations") = true,
        "float64 y [L, dim] of one request's tokens x [L, dim] (float64, positions 0..L-1)");
}

}  // namespace dsv4::python
