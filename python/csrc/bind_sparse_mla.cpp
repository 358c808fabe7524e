// Bindings of the DeepSeek-V3.2 sparse-MLA layer: dsv4::SparseMlaAttention
// (include/dsv4/sparse_mla_layer.h), its weights (sparse_mla_weights.h: random, from a checkpoint,
// from a torch state dict, under the official names) and its float64 reference
// (sparse_mla_reference.h). CPU or CUDA backend; x and y cross by DLPack, weights by copy.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <vector>

#include "dsv4/sparse_mla_layer.h"
#include "dsv4/sparse_mla_reference.h"
#include "dsv4/sparse_mla_weights.h"
#include "layer_args.h"
#include "tensor_args.h"

namespace dsv4::python {

namespace {

using nb::arg;
using Release = nb::call_guard<nb::gil_scoped_release>;

constexpr char kForward[] = "SparseMlaAttention.forward";

void bind_sparse_mla_weights(nb::module_& m) {
  nb::class_<SparseMlaWeights>(
      m, "SparseMlaWeights",
      "The weights of one DeepSeek-V3.2 sparse-MLA layer (include/dsv4/sparse_mla_weights.h), held "
      "in C++. Checkpoint names: tensor_names(config); torch copies: tensors(config).")
      .def_static(
          "random",
          [](const ModelConfig& cfg, const IntArg& layer, const IntArg& seed, bool fp8) {
            constexpr const char* k = "SparseMlaWeights.random";
            return random_sparse_mla_weights(cfg, int_arg(k, "layer", layer), seed_arg(k, seed), fp8);
          },
          arg("config"), arg("layer").none(), arg("seed").none() = 1, arg("fp8") = true,
          "Deterministic random weights (fp8: FP8 e4m3 + UE8M0 block scales where the released "
          "checkpoint stores FP8, else bf16)")
      .def_static(
          "from_checkpoint",
          [](const std::string& path, const ModelConfig& cfg, const IntArg& layer) {
            const int l = int_arg("SparseMlaWeights.from_checkpoint", "layer", layer);
            return load_sparse_mla_weights(Checkpoint::open(path), cfg, l);
          },
          arg("path"), arg("config"), arg("layer").none(),
          "The layer's tensors of a checkpoint (inference-code or Hugging Face names)")
      .def_static(
          "from_state_dict",
          [](const StateDict& tensors, const ModelConfig& cfg, const IntArg& layer) {
            const int l = int_arg("SparseMlaWeights.from_state_dict", "layer", layer);
            return load_sparse_mla_weights(StateDictSource(tensors), cfg, l);
          },
          arg("tensors"), arg("config"), arg("layer").none(),
          "The layer's tensors of a {name: tensor} dict (copied)")
      .def_ro("layer", &SparseMlaWeights::layer)
      .def(
          "tensor_names",
          [](const SparseMlaWeights& w, const ModelConfig& cfg) { return sparse_mla_tensor_names(w, cfg); },
          arg("config"), "The checkpoint names of these weights' tensors, sorted")
      .def(
          "tensors",
          [](const SparseMlaWeights& w, const ModelConfig& cfg) {
            TensorMap tensors;
            add_sparse_mla_tensors(w, cfg, tensors);
            nb::dict out;
            for (const auto& [name, t] : tensors) out[nb::str(name.c_str())] = torch_copy(t);
            return out;
          },
          arg("config"), "{checkpoint name: CPU torch tensor} (copies)");
}

void bind_sparse_mla_layer(nb::module_& m) {
  nb::class_<SparseMlaAttention>(m, "SparseMlaAttention",
                                 "One DeepSeek-V3.2 sparse-MLA layer with its weights and paged "
                                 "caches (CPU or CUDA), include/dsv4/sparse_mla_layer.h. Not safe "
                                 "to call from two threads at once.")
      .def(
          "__init__",
          [](SparseMlaAttention* self, const ModelConfig& cfg, const IntArg& layer,
             const SparseMlaWeights& w, const IntArg& cache_blocks, const IntArg& block_size,
             bool fp8_activations, const std::string& backend, bool cuda_graphs) {
            constexpr const char* k = "SparseMlaAttention";
            SparseMlaOptions opts;
            if (backend != "cpu" && backend != "cuda") fail_expected(k, "backend", "cpu or cuda", backend);
            opts.backend = backend == "cuda" ? Backend::cuda : Backend::cpu;
            opts.cache_blocks = int_arg(k, "cache_blocks", cache_blocks);
            opts.block_size = int_arg(k, "block_size", block_size);
            opts.fp8_activations = fp8_activations;  // covers every FP8 activation quantization
            opts.fp8_gemm_activations = fp8_activations;
            opts.cuda_graphs = cuda_graphs;
            new (self) SparseMlaAttention(cfg, int_arg(k, "layer", layer), w, opts);
          },
          arg("config"), arg("layer").none(), arg("weights"), arg("cache_blocks").none(),
          arg("block_size").none(), arg("fp8_activations"), arg("backend") = "cpu",
          arg("cuda_graphs") = true)
      .def("forward", &forward_op<SparseMlaAttention, kForward>, arg("req_ids"), arg("contexts"),
           arg("num_new"), arg("x").none(), arg("y").none(), Release(),
           "x [T, dim] → y [T, dim] fp32 (contiguous, on the layer's device; CUDA: x bf16); rows "
           "follow the given request order (on CUDA: already the layer's, decodes first)")
      .def(
          "set_stream",
          [](SparseMlaAttention& a, uintptr_t stream) { a.set_stream(reinterpret_cast<Stream>(stream)); },
          arg("stream"), "CUDA: the cudaStream_t (as an int) later forwards run on")
      .def("reserve", &SparseMlaAttention::reserve, arg("max_tokens"), arg("max_requests"),
           arg("max_context"), Release(),
           "Sizes every workspace for steps within these bounds; returns the memory (bytes)")
      .def("memory", &SparseMlaAttention::memory)
      .def_prop_ro("graph_captures", &SparseMlaAttention::graph_captures)
      .def_prop_ro("graph_replays", &SparseMlaAttention::graph_replays)
      .def(
          "release",
          [](SparseMlaAttention& a, const IntArg& req_id) {
            a.release(int64_arg("SparseMlaAttention.release", "req_id", req_id));
          },
          arg("req_id").none())
      .def_prop_ro("config", &SparseMlaAttention::config)
      .def_prop_ro("layer", &SparseMlaAttention::layer_index)
      .def_prop_ro("padded_heads", &SparseMlaAttention::padded_heads)
      .def_prop_ro("weights", &SparseMlaAttention::weights);
}

using HostF64 = nb::ndarray<const double, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

nb::ndarray<nb::pytorch, double> reference_op(const ModelConfig& cfg, const SparseMlaWeights& w,
                                              const HostF64& x, bool fp8_activations) {
  const char* where = "reference_sparse_mla_layer";
  DSV4_CHECK_EQ(where, "x.shape[1] (dim)", static_cast<size_t>(cfg.dim), x.shape(1));
  const std::vector<double> xs(x.data(), x.data() + x.size());
  auto y = std::make_unique<std::vector<double>>();
  {
    nb::gil_scoped_release release;
    *y = reference_sparse_mla_layer(cfg, w, xs, ReferenceOptions{fp8_activations, fp8_activations});
  }
  double* data = y->data();
  nb::capsule owner(y.release(), [](void* p) noexcept { delete static_cast<std::vector<double>*>(p); });
  const size_t shape[2] = {x.shape(0), x.shape(1)};
  return nb::ndarray<nb::pytorch, double>(data, 2, shape, owner);
}

}  // namespace

void bind_sparse_mla(nb::module_& m) {
  bind_sparse_mla_weights(m);
  bind_sparse_mla_layer(m);
  m.def("reference_sparse_mla_layer", &reference_op, arg("config"), arg("weights"), arg("x"),
        arg("fp8_activations") = true,
        "float64 y [L, dim] of one request's tokens x [L, dim] (float64, positions 0..L-1)");
}

}  // namespace dsv4::python
