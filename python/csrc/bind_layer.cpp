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

// A seed: any integer in [0, 2**64) (negative or larger seeds are an error, not wrapped).
uint64_t seed_arg(const char* where, const IntArg& seed) {
  if (seed.type_name == nullptr && seed.overflow > 0)
    fail_expected(where, "seed", "an integer in [0, 2**63 - 1]", "an int above 2**63 - 1");
  return static_cast<uint64_t>(int64_arg(where, "seed", seed, 0, INT64_MAX));
}

// One step's requests (ids, contexts, num_new: one of each per request) as RequestSteps.
std::vector<RequestStep> request_steps(const char* where, const std::vector<IntArg>& req_ids,
                                       const std::vector<IntArg>& contexts,
                                       const std::vector<IntArg>& num_new) {
  DSV4_CHECK_EQ(where, "len(contexts) (one per request id)", req_ids.size(), contexts.size());
  DSV4_CHECK_EQ(where, "len(num_new) (one per request id)", req_ids.size(), num_new.size());
  std::vector<RequestStep> steps;
  for (size_t i = 0; i < req_ids.size(); ++i) {
    const auto item = [&](const char* list, const IntArg& v) {
      return int64_arg(where, detail::concat(list, "[", i, "]").c_str(), v);
    };
    steps.push_back({item("req_ids", req_ids[i]), item("contexts", contexts[i]),
                     item("num_new", num_new[i])});
  }
  return steps;
}

void bind_weights(nb::module_& m) {
  nb::class_<AttentionWeights>(
      m, "AttentionWeights",
      "The weights of one attention layer (include/dsv4/weights.h), held in C++. Official "
      "checkpoint names: tensor_names(config); torch copies: tensors(config).")
      .def_static(
          "random",
          [](const ModelConfig& cfg, const IntArg& layer, const IntArg& seed, bool fp8) {
            constexpr const char* k = "AttentionWeights.random";
            return random_attention_weights(cfg, int_arg(k, "layer", layer), seed_arg(k, seed), fp8);
          },
          arg("config"), arg("layer").none(), arg("seed").none() = 1, arg("fp8") = true,
                  "Deterministic random weights (fp8: FP8 e4m3 + UE8M0 block scales where the "
                  "released checkpoints store FP8, else bf16)")
      .def_static(
          "from_checkpoint",
          [](const std::string& path, const ModelConfig& cfg, const IntArg& layer) {
            const int l = int_arg("AttentionWeights.from_checkpoint", "layer", layer);
            return load_attention_weights(Checkpoint::open(path), cfg, l);
          },
          arg("path"), arg("config"), arg("layer").none(),
          "The layer's tensors of a checkpoint (a directory of *.safetensors, with or without "
          "model.safetensors.index.json, or one .safetensors file)")
      .def_static(
          "from_state_dict",
          [](const StateDict& tensors, const ModelConfig& cfg, const IntArg& layer) {
            const int l = int_arg("AttentionWeights.from_state_dict", "layer", layer);
            return load_attention_weights(StateDictSource(tensors), cfg, l);
          },
          arg("tensors"), arg("config"), arg("layer").none(),
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

Attention make_attention(const ModelConfig& cfg, const IntArg& layer_arg, const AttentionWeights& w,
                         const IntArg& swa_blocks, const IntArg& compressed_blocks,
                         const IntArg& state_blocks, const IntArg& swa_block_size,
                         bool fp8_activations, const std::string& backend, bool cuda_graphs) {
  constexpr const char* k = "Attention";
  const int layer = int_arg(k, "layer", layer_arg);
  check_weights_for(k, w, cfg, layer);
  AttentionOptions opts;
  if (backend != "cpu" && backend != "cuda") fail_expected(k, "backend", "cpu or cuda", backend);
  opts.backend = backend == "cuda" ? Backend::cuda : Backend::cpu;
  opts.caches.swa_blocks = int_arg(k, "swa_blocks", swa_blocks);
  opts.caches.compressed_blocks = int_arg(k, "compressed_blocks", compressed_blocks);
  opts.caches.state_blocks = int_arg(k, "state_blocks", state_blocks);
  opts.caches.swa_block_size = int_arg(k, "swa_block_size", swa_block_size);
  opts.fp8_activations = fp8_activations;  // Python's flag covers every FP8 activation quantization
  opts.fp8_gemm_activations = fp8_activations;
  opts.cuda_graphs = cuda_graphs;
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
void forward_op(Layer& layer, const std::vector<IntArg>& req_ids,
                const std::vector<IntArg>& contexts, const std::vector<IntArg>& num_new,
                const TensorArg& x_arg, const TensorArg& y_arg) {
  const char* where = std::is_same_v<Layer, Attention> ? "Attention.forward" : "AttentionStack.forward";
  const std::vector<RequestStep> steps = request_steps(where, req_ids, contexts, num_new);
  const TensorView x = tensor_arg(where, "x", x_arg), y = tensor_arg(where, "y", y_arg);
  // x and y must match the batch before a plan of the batch's size is built (a batch claiming
  // 2**26 tokens against one row of x is an error, not gigabytes of metadata first).
  const int64_t T = BatchPlan::count_tokens(steps), dim = layer.config().dim;
  check_shape(where, "x", x, {T, dim});
  check_shape(where, "y", y, {T, dim});
  const BatchPlan plan = BatchPlan::make(steps);

  bool same_order = true;
  for (size_t i = 0; i < steps.size(); ++i) same_order &= plan.requests[i].req_id == steps[i].req_id;
  if (same_order) {
    layer.forward(plan, x, y);
    return;
  }
  // Both tensors are read row by row below: check what the copies rely on first.
  for (const auto& [name, t] : {std::pair{"x", x}, std::pair{"y", y}}) {
    check_device(where, name, t, Device::cpu);
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

void bind_memory(nb::module_& m) {
  nb::class_<LayerMemory>(m, "LayerMemory", "Bytes one layer holds on its device")
      .def_ro("weights", &LayerMemory::weights)
      .def_ro("caches", &LayerMemory::caches)
      .def_ro("workspace", &LayerMemory::workspace)
      .def_ro("workspace_used", &LayerMemory::workspace_used)
      .def_ro("step_upload", &LayerMemory::step_upload)
      .def("__repr__", [](const LayerMemory& mem) {
        return "<dsv4attn.LayerMemory weights " + std::to_string(mem.weights) + " B, caches " +
               std::to_string(mem.caches) + " B, workspace " + std::to_string(mem.workspace) +
               " B (used " + std::to_string(mem.workspace_used) + "), step upload " +
               std::to_string(mem.step_upload) + " B>";
      });
}

void bind_attention(nb::module_& m) {
  bind_memory(m);
  nb::class_<Attention>(m, "Attention",
                        "One attention layer with its weights and paged caches (CPU or CUDA), "
                        "include/dsv4/layer.h. Not safe to call from two threads at once.")
      .def(
          "__init__",
          [](Attention* self, const ModelConfig& cfg, const IntArg& layer,
             const AttentionWeights& w, const IntArg& swa_blocks, const IntArg& compressed_blocks,
             const IntArg& state_blocks, const IntArg& swa_block_size, bool fp8_activations,
             const std::string& backend, bool cuda_graphs) {
            new (self) Attention(make_attention(cfg, layer, w, swa_blocks, compressed_blocks,
                                                state_blocks, swa_block_size, fp8_activations,
                                                backend, cuda_graphs));
          },
          arg("config"), arg("layer").none(), arg("weights"), arg("swa_blocks").none(),
          arg("compressed_blocks").none(), arg("state_blocks").none(),
          arg("swa_block_size").none(), arg("fp8_activations"), arg("backend") = "cpu",
          arg("cuda_graphs") = true)
      .def("forward", &forward_op<Attention>, arg("req_ids"), arg("contexts"), arg("num_new"),
           arg("x").none(), arg("y").none(), Release(),
           "x [T, dim] bf16/fp32 → y [T, dim] fp32 (CPU, contiguous); rows follow the given "
           "request order")
      .def(
          "release",
          [](Attention& a, const IntArg& req_id) {
            a.release(int64_arg("Attention.release", "req_id", req_id));
          },
          arg("req_id").none())
      .def(
          "set_stream",
          [](Attention& a, uintptr_t stream) { a.set_stream(reinterpret_cast<Stream>(stream)); },
          arg("stream"), "CUDA: the cudaStream_t (as an int) later forwards run on")
      .def("reserve", &Attention::reserve, arg("max_tokens"), arg("max_requests"),
           arg("max_context"), Release(),
           "Sizes every workspace for steps within these bounds; returns the memory (bytes)")
      .def("memory", &Attention::memory)
      .def_prop_ro("graph_captures", &Attention::graph_captures)
      .def_prop_ro("graph_replays", &Attention::graph_replays)
      .def_prop_ro("config", &Attention::config)
      .def_prop_ro("layer", &Attention::layer_index)
      .def_prop_ro("kind",
                   [](const Attention& a) { return std::string(layer_kind_name(a.kind())); })
      .def_prop_ro("weights", &Attention::weights);
}

// ---- the attention stack -----------------------------------------------------------------------

int checked_layer(const AttentionStack& s, const IntArg& i) {
  return static_cast<int>(
      int64_arg("AttentionStack", "layer position", i, 0, int64_t{s.num_layers()} - 1));
}

void bind_stack(nb::module_& m) {
  nb::class_<AttentionStack>(m, "AttentionStack",
                             "The attention layers of a config (include/dsv4/model.h), each with "
                             "its own weights and caches, residually chained")
      .def(
          "__init__",
          [](AttentionStack* self, const ModelConfig& cfg, const std::vector<IntArg>& layers,
             const std::string& weights_dir, const IntArg& seed, bool fp8_weights,
             const IntArg& swa_blocks, const IntArg& compressed_blocks, const IntArg& state_blocks,
             bool fp8_activations, const std::string& backend, bool cuda_graphs) {
            constexpr const char* k = "AttentionStack";
            StackOptions so;
            for (size_t i = 0; i < layers.size(); ++i)
              so.layers.push_back(int_arg(k, detail::concat("layers[", i, "]").c_str(), layers[i]));
            so.weights_dir = weights_dir;
            so.seed = seed_arg(k, seed);
            so.fp8_weights = fp8_weights;
            so.attention.caches.swa_blocks = int_arg(k, "swa_blocks", swa_blocks);
            so.attention.caches.compressed_blocks = int_arg(k, "compressed_blocks", compressed_blocks);
            so.attention.caches.state_blocks = int_arg(k, "state_blocks", state_blocks);
            so.attention.fp8_activations = fp8_activations;
            so.attention.cuda_graphs = cuda_graphs;
            so.attention.fp8_gemm_activations = fp8_activations;
            if (backend != "cpu" && backend != "cuda")
              fail_expected("AttentionStack", "backend", "cpu or cuda", backend);
            so.attention.backend = backend == "cuda" ? Backend::cuda : Backend::cpu;
            new (self) AttentionStack(cfg, so);
          },
          arg("config"), arg("layers"), arg("weights_dir"), arg("seed").none(),
          arg("fp8_weights"), arg("swa_blocks").none(), arg("compressed_blocks").none(),
          arg("state_blocks").none(), arg("fp8_activations"), arg("backend"),
          arg("cuda_graphs") = true)
      .def("forward", &forward_op<AttentionStack>, arg("req_ids"), arg("contexts"),
           arg("num_new"), arg("x").none(), arg("y").none(), Release(),
           "x [T, dim] fp32 → y [T, dim] fp32 (contiguous; on the CPU, or on the layers' GPU); "
           "rows follow the given order")
      .def(
          "set_stream",
          [](AttentionStack& s, uintptr_t stream) { s.set_stream(reinterpret_cast<Stream>(stream)); },
          arg("stream"), "CUDA: the cudaStream_t (as an int) later forwards run on")
      .def(
          "release",
          [](AttentionStack& s, const IntArg& req_id) {
            s.release(int64_arg("AttentionStack.release", "req_id", req_id));
          },
          arg("req_id").none())
      .def_prop_ro("num_layers", &AttentionStack::num_layers)
      .def(
          "layer_index",
          [](AttentionStack& s, const IntArg& i) { return s.layer(checked_layer(s, i)).layer_index(); },
          arg("i").none())
      .def(
          "layer_kind",
          [](AttentionStack& s, const IntArg& i) {
            return std::string(layer_kind_name(s.layer(checked_layer(s, i)).kind()));
          },
          arg("i").none());
}

// ---- the float64 reference ----------------------------------------------------------------------

using HostF64 = nb::ndarray<const double, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

nb::ndarray<nb::pytorch, double> reference_op(const ModelConfig& cfg, const IntArg& layer_arg,
                                              const AttentionWeights& w, const HostF64& x,
                                              bool fp8_activations) {
  const char* where = "reference_attention_layer";
  const int layer = int_arg(where, "layer", layer_arg);
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
      [](const std::vector<IntArg>& req_ids, const std::vector<IntArg>& contexts,
         const std::vector<IntArg>& num_new) {
        const std::vector<RequestStep> steps = request_steps("plan_order", req_ids, contexts, num_new);
        BatchPlan::count_tokens(steps);  // make()'s checks, without building the plan
        return BatchPlan::kernel_order(steps);
      },
      arg("req_ids"), arg("contexts"), arg("num_new"),
      "The order the layer runs requests in (decodes first): indices into the given lists");
  bind_weights(m);
  bind_attention(m);
  m.def("reference_attention_layer", &reference_op, arg("config"), arg("layer").none(), arg("weights"),
        arg("x"), arg("fp8_activations") = true,
        "float64 y [L, dim] of one request's tokens x [L, dim] (float64, positions 0..L-1)");
}

}  // namespace dsv4::python
