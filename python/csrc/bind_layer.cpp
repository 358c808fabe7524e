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
#include "layer_args.h"
#include "tensor_args.h"

namespace dsv4::python {

namespace {

using nb::arg;
using Release = nb::call_guard<nb::gil_scoped_release>;

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

// The layer's cache layout from Python: "model1" (MODEL1_FP8), "bf16" or "fp8_per_tensor" (vLLM's
// kv-cache dtype name; docs/design.md). The float64 reference takes the same arguments to model
// what the cache hands back.
KvLayout kv_layout_arg(const char* where, const std::string& name) {
  if (name == "model1") return KvLayout::model1_fp8;
  if (name == "bf16") return KvLayout::bf16;
  if (name == "fp8_per_tensor") return KvLayout::fp8_per_tensor;
  fail_expected(where, "kv_layout", "'model1', 'bf16' or 'fp8_per_tensor'", "'" + name + "'");
}

// A per-tensor FP8 scale of the layer (`name`): kv_scale, the FP8_PER_TENSOR caches' scale, or
// q_scale, the FP8 queries' the layer decodes with over them; any other layout takes only the
// default 1.
float per_tensor_scale_arg(const char* where, const char* name, KvLayout layout, double scale) {
  if (layout != KvLayout::fp8_per_tensor && scale != 1.0)
    fail_expected(where, name, "1 (a scale applies to kv_layout 'fp8_per_tensor' only)", scale);
  if (!(scale > 0.0 && scale < 3.0e38))
    fail_expected(where, name, "a finite value > 0", scale);
  return static_cast<float>(scale);
}

Attention make_attention(const ModelConfig& cfg, const IntArg& layer_arg, const AttentionWeights& w,
                         const IntArg& swa_blocks, const IntArg& compressed_blocks,
                         const IntArg& state_blocks, const IntArg& swa_block_size,
                         bool fp8_activations, const std::string& backend, bool cuda_graphs,
                         bool caller_caches, const IntArg& tp_rank, const IntArg& tp_size,
                         const std::string& kv_layout, double kv_scale, double q_scale) {
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
  opts.caches.layout = kv_layout_arg(k, kv_layout);
  opts.caches.kv_scale = per_tensor_scale_arg(k, "kv_scale", opts.caches.layout, kv_scale);
  opts.caches.q_scale = per_tensor_scale_arg(k, "q_scale", opts.caches.layout, q_scale);
  opts.fp8_activations = fp8_activations;  // Python's flag covers every FP8 activation quantization
  opts.fp8_gemm_activations = fp8_activations;
  opts.cuda_graphs = cuda_graphs;
  opts.caller_caches = caller_caches;
  // Tensor parallelism: this rank's shard; y is its partial sum, reduced by the Python caller.
  opts.tp.rank = int_arg(k, "tp_rank", tp_rank);
  opts.tp.size = int_arg(k, "tp_size", tp_size);
  return Attention(cfg, layer, w, opts);
}

// Caller-owned caches (AttentionOptions::caller_caches): the engine's cache tensors as byte views
// [num_blocks, block_bytes] (python/dsv4attn/layer.py reshapes vLLM's tensors to that, keeping
// their block stride) and one step's metadata (host tensors).
void bind_caller_caches(Attention& a, const TensorArg& swa, const TensorArg& compressed,
                        const TensorArg& compressor_state, const TensorArg& indexer_keys,
                        const TensorArg& indexer_state) {
  constexpr const char* k = "Attention.bind_caches";
  CallerCaches c;
  c.swa = optional_tensor_arg(k, "caches.swa", swa);
  c.compressed = optional_tensor_arg(k, "caches.compressed", compressed);
  c.compressor_state = optional_tensor_arg(k, "caches.compressor_state", compressor_state);
  c.indexer_keys = optional_tensor_arg(k, "caches.indexer_keys", indexer_keys);
  c.indexer_state = optional_tensor_arg(k, "caches.indexer_state", indexer_state);
  a.bind_caches(c);
}

void forward_caller_step(Attention& a, const TensorArg& query_start_loc, const TensorArg& seq_lens,
                         const TensorArg& positions, const TensorArg& slot_mapping,
                         const TensorArg& swa_table, const TensorArg& compressed_table,
                         const TensorArg& state_table, const TensorArg& keys_table,
                         const TensorArg& index_state_table, const TensorArg& x,
                         const TensorArg& y, uintptr_t stream) {
  constexpr const char* k = "Attention.forward_step";
  CallerStep st;
  st.query_start_loc = tensor_arg(k, "step.query_start_loc", query_start_loc);
  st.seq_lens = tensor_arg(k, "step.seq_lens", seq_lens);
  st.positions = tensor_arg(k, "step.positions", positions);
  st.slot_mapping = tensor_arg(k, "step.slot_mapping", slot_mapping);
  st.swa_block_table = optional_tensor_arg(k, "step.swa_block_table", swa_table);
  st.compressed_block_table = optional_tensor_arg(k, "step.compressed_block_table", compressed_table);
  st.compressor_state_block_table =
      optional_tensor_arg(k, "step.compressor_state_block_table", state_table);
  st.indexer_keys_block_table = optional_tensor_arg(k, "step.indexer_keys_block_table", keys_table);
  st.indexer_state_block_table =
      optional_tensor_arg(k, "step.indexer_state_block_table", index_state_table);
  const TensorView xv = tensor_arg(k, "x", x), yv = tensor_arg(k, "y", y);
  nb::gil_scoped_release release;
  if (a.backend() == Backend::cuda) a.set_stream(stream_of(stream));
  a.forward(st, xv, yv);
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

constexpr char kAttentionForward[] = "Attention.forward";
constexpr char kStackForward[] = "AttentionStack.forward";

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
             const std::string& backend, bool cuda_graphs, bool caller_caches,
             const IntArg& tp_rank, const IntArg& tp_size, const std::string& kv_layout,
             double kv_scale, double q_scale) {
            new (self) Attention(make_attention(cfg, layer, w, swa_blocks, compressed_blocks,
                                                state_blocks, swa_block_size, fp8_activations,
                                                backend, cuda_graphs, caller_caches, tp_rank,
                                                tp_size, kv_layout, kv_scale, q_scale));
          },
          arg("config"), arg("layer").none(), arg("weights"), arg("swa_blocks").none(),
          arg("compressed_blocks").none(), arg("state_blocks").none(),
          arg("swa_block_size").none(), arg("fp8_activations"), arg("backend") = "cpu",
          arg("cuda_graphs") = true, arg("caller_caches") = false,
          arg("tp_rank").none() = 0, arg("tp_size").none() = 1, arg("kv_layout") = "model1",
          arg("kv_scale") = 1.0, arg("q_scale") = 1.0)
      .def("bind_caches", &bind_caller_caches, arg("swa").none(), arg("compressed").none(),
           arg("compressor_state").none(), arg("indexer_keys").none(), arg("indexer_state").none(),
           "Caller-owned caches: uint8 [num_blocks, block_bytes] views (any block stride)")
      .def("forward_step", &forward_caller_step, arg("query_start_loc").none(),
           arg("seq_lens").none(), arg("positions").none(), arg("slot_mapping").none(),
           arg("swa_block_table").none(), arg("compressed_block_table").none(),
           arg("compressor_state_block_table").none(), arg("indexer_keys_block_table").none(),
           arg("indexer_state_block_table").none(), arg("x").none(), arg("y").none(),
           arg("stream") = 0,
           "One step on caller-owned caches (include/dsv4/caller_step.h); metadata on the host")
      .def_prop_ro("caller_caches", &Attention::caller_caches)
      .def("forward", &forward_op<Attention, kAttentionForward>, arg("req_ids"), arg("contexts"), arg("num_new"),
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
      .def("forward", &forward_op<AttentionStack, kStackForward>, arg("req_ids"), arg("contexts"),
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
          [](AttentionStack& s, const IntArg& i) { return s.layer_index(checked_layer(s, i)); },
          arg("i").none())
      .def(
          "layer_kind",
          [](AttentionStack& s, const IntArg& i) {
            const int l = checked_layer(s, i);
            return s.sparse_mla() ? std::string("MLA") : std::string(layer_kind_name(s.layer_kind(l)));
          },
          arg("i").none());
}

// ---- the float64 reference ----------------------------------------------------------------------

using HostF64 = nb::ndarray<const double, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

nb::ndarray<nb::pytorch, double> reference_op(const ModelConfig& cfg, const IntArg& layer_arg,
                                              const AttentionWeights& w, const HostF64& x,
                                              bool fp8_activations, const std::string& kv_layout,
                                              double kv_scale, double q_scale) {
  const char* where = "reference_attention_layer";
  ReferenceOptions opts{fp8_activations, fp8_activations};
  opts.kv_layout = kv_layout_arg(where, kv_layout);
  opts.kv_scale = per_tensor_scale_arg(where, "kv_scale", opts.kv_layout, kv_scale);
  opts.q_scale = per_tensor_scale_arg(where, "q_scale", opts.kv_layout, q_scale);
  const int layer = int_arg(where, "layer", layer_arg);
  check_weights_for(where, w, cfg, layer);
  DSV4_CHECK_EQ(where, "x.shape[1] (dim)", static_cast<size_t>(cfg.dim), x.shape(1));
  const std::vector<double> xs(x.data(), x.data() + x.size());
  auto y = std::make_unique<std::vector<double>>();
  {
    nb::gil_scoped_release release;
    *y = reference_attention_layer(cfg, layer, w, xs, opts);
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
        arg("x"), arg("fp8_activations") = true, arg("kv_layout") = "model1", arg("kv_scale") = 1.0,
        arg("q_scale") = 1.0,
        "float64 y [L, dim] of one request's tokens x [L, dim] (float64, positions 0..L-1)");
}

}  // namespace dsv4::python
