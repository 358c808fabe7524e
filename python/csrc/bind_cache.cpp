// Bindings of the cache layouts (kv_layout.h), the index planning utilities (indexing.h) and
// the model configuration (config.h).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include "dsv4/config.h"
#include "dsv4/indexing.h"
#include "dsv4/kv_layout.h"
#include "tensor_args.h"

namespace dsv4::python {

namespace {

using nb::arg;
using Release = nb::call_guard<nb::gil_scoped_release>;

// Tensor and integer arguments come as TensorArg / IntArg (tensor_args.h): a wrong one is a
// dsv4::Error naming op and argument.
nb::dict geometry_op(const std::string& layout, const IntArg& block_size) {
  const KvGeometry g = kv_geometry(parse_kv_layout(layout), int_arg("kv_geometry", "block_size", block_size));
  nb::dict d;
  d["layout"] = std::string(kv_layout_name(g.layout));
  d["block_size"] = g.block_size;
  d["dim"] = g.dim;
  d["token_bytes"] = g.token_bytes;
  d["block_bytes"] = g.block_bytes;
  return d;
}

void kv_quantize_op(const TensorArg& cache, const std::string& layout, const IntArg& block_size,
                    float tensor_scale, const TensorArg& values, const TensorArg& slots) {
  constexpr const char* k = "kv_quantize";
  kv_quantize(cache_arg(k, "cache", cache, layout, block_size, tensor_scale),
              tensor_arg(k, "values", values), tensor_arg(k, "slots", slots));
}

void kv_dequantize_op(const TensorArg& cache, const std::string& layout, const IntArg& block_size,
                      float tensor_scale, const TensorArg& slots, const TensorArg& out) {
  constexpr const char* k = "kv_dequantize";
  kv_dequantize(cache_arg(k, "cache", cache, layout, block_size, tensor_scale),
                tensor_arg(k, "slots", slots), tensor_arg(k, "out", out));
}

void local_to_global_op(const TensorArg& local, const TensorArg& token_to_req,
                        const TensorArg& block_table, const IntArg& block_size,
                        const TensorArg& global, const TensorArg& lens, bool checked,
                        uintptr_t stream) {
  const char* k = checked ? "local_to_global_slots_checked" : "local_to_global_slots";
  const TensorView l = tensor_arg(k, "local", local), r = tensor_arg(k, "token_to_req", token_to_req);
  const TensorView b = tensor_arg(k, "block_table", block_table), g = tensor_arg(k, "global", global);
  const TensorView n = optional_tensor_arg(k, "lens", lens);
  const int bs = int_arg(k, "block_size", block_size);
  if (checked) local_to_global_slots_checked(l, r, b, bs, g, n);
  else local_to_global_slots(l, r, b, bs, g, n, stream_of(stream));
}

void swa_window_op(const TensorArg& positions, const TensorArg& token_to_req,
                   const TensorArg& block_table, const IntArg& block_size, const IntArg& window,
                   const TensorArg& indices, const TensorArg& lens, uintptr_t stream) {
  constexpr const char* k = "swa_window_indices";
  swa_window_indices(tensor_arg(k, "positions", positions),
                     tensor_arg(k, "token_to_req", token_to_req),
                     tensor_arg(k, "block_table", block_table), int_arg(k, "block_size", block_size),
                     int_arg(k, "window", window), tensor_arg(k, "indices", indices),
                     tensor_arg(k, "lens", lens), stream_of(stream));
}

void combine_topk_swa_op(const TensorArg& topk, const TensorArg& query_start_loc,
                         const TensorArg& seq_lens, const TensorArg& gather_lens,
                         const IntArg& window, const IntArg& compressed_region,
                         const IntArg& rows_per_request, const IntArg& ratio, const TensorArg& out,
                         const TensorArg& out_lens, uintptr_t stream) {
  constexpr const char* k = "combine_topk_swa_indices";
  combine_topk_swa_indices(
      tensor_arg(k, "topk", topk), tensor_arg(k, "query_start_loc", query_start_loc),
      tensor_arg(k, "seq_lens", seq_lens), tensor_arg(k, "gather_lens", gather_lens),
      int_arg(k, "window", window), int_arg(k, "compressed_region", compressed_region),
      int64_arg(k, "rows_per_request", rows_per_request), int_arg(k, "ratio", ratio),
      tensor_arg(k, "out", out), tensor_arg(k, "out_lens", out_lens), stream_of(stream));
}

nb::dict rope_dict(const RopeConfig& r) {
  nb::dict d;
  d["theta"] = r.theta;
  d["rope_dims"] = r.rope_dims;
  d["yarn"] = r.yarn;
  d["factor"] = r.factor;
  d["original_seq_len"] = r.original_seq_len;
  d["beta_fast"] = r.beta_fast;
  d["beta_slow"] = r.beta_slow;
  return d;
}

// A layer index argument (the config then checks it against its layers).
int config_layer(const ModelConfig& c, const IntArg& layer) {
  return int_arg(("ModelConfig(" + c.name + ")").c_str(), "layer", layer);
}

void bind_config(nb::module_& m) {
  nb::class_<ModelConfig>(m, "ModelConfig",
                          "Attention settings of a model (include/dsv4/config.h), read-only.")
      .def_static("builtin", &ModelConfig::builtin, arg("name"))
      .def_static("builtin_names", &ModelConfig::builtin_names)
      .def_static("from_json_file", &ModelConfig::from_json_file, arg("path"),
                  "`path`: a config.json file or a directory holding one")
      .def_static("from_json_string", &ModelConfig::from_json_string, arg("json"),
                  arg("name") = "json")
      .def_ro("name", &ModelConfig::name)
      .def_ro("family", &ModelConfig::family)
      .def_ro("dim", &ModelConfig::dim)
      .def_ro("n_heads", &ModelConfig::n_heads)
      .def_ro("head_dim", &ModelConfig::head_dim)
      .def_ro("rope_head_dim", &ModelConfig::rope_head_dim)
      .def_ro("v_head_dim", &ModelConfig::v_head_dim)
      .def_ro("q_lora_rank", &ModelConfig::q_lora_rank)
      .def_ro("o_groups", &ModelConfig::o_groups)
      .def_ro("o_lora_rank", &ModelConfig::o_lora_rank)
      .def_ro("window_size", &ModelConfig::window_size)
      .def_ro("compress_ratios", &ModelConfig::compress_ratios)
      .def_ro("index_n_heads", &ModelConfig::index_n_heads)
      .def_ro("index_head_dim", &ModelConfig::index_head_dim)
      .def_ro("index_topk", &ModelConfig::index_topk)
      .def_ro("norm_eps", &ModelConfig::norm_eps)
      .def_ro("max_position", &ModelConfig::max_position)
      .def_prop_ro("n_layers", &ModelConfig::n_layers)
      .def("layer_kind",
           [](const ModelConfig& c, const IntArg& layer) {
             return std::string(layer_kind_name(c.layer_kind(config_layer(c, layer))));
           },
           arg("layer").none(), "\"SWA\", \"C4A\" or \"C128A\"")
      .def("compress_ratio",
           [](const ModelConfig& c, const IntArg& layer) {
             return c.compress_ratio(config_layer(c, layer));
           },
           arg("layer").none())
      .def("rope_for_layer",
           [](const ModelConfig& c, const IntArg& layer) {
             return rope_dict(c.rope_for_layer(config_layer(c, layer)));
           },
           arg("layer").none())
      .def("validate", &ModelConfig::validate)
      .def("describe", [](const ModelConfig& c) { return describe(c); })
      .def("__repr__",
           [](const ModelConfig& c) { return "<dsv4attn.ModelConfig " + c.name + ">"; });
}

}  // namespace

void bind_cache(nb::module_& m) {
  // Tensor and integer arguments take any Python object, None included: the op names a wrong one
  // (TensorArg, IntArg).
  const auto any = [](const char* name) { return arg(name).none(); };
  m.def("kv_geometry", &geometry_op, arg("layout"), any("block_size"),
        "Byte geometry of a cache layout at a block size (dict)");
  m.def("kv_quantize", &kv_quantize_op, any("cache"), arg("layout"), any("block_size"),
        arg("tensor_scale"), any("values"), any("slots"), Release());
  m.def("kv_dequantize", &kv_dequantize_op, any("cache"), arg("layout"), any("block_size"),
        arg("tensor_scale"), any("slots"), any("out"), Release());
  m.def("local_to_global_slots", &local_to_global_op, any("local"), any("token_to_req"),
        any("block_table"), any("block_size"), any("global_"), any("lens"),
        arg("checked") = false, arg("stream") = 0, Release());
  m.def("swa_window_indices", &swa_window_op, any("positions"), any("token_to_req"),
        any("block_table"), any("block_size"), any("window"), any("indices"), any("lens"),
        arg("stream") = 0, Release());
  m.def("combine_topk_swa_indices", &combine_topk_swa_op, any("topk"), any("query_start_loc"),
        any("seq_lens"), any("gather_lens"), any("window"), any("compressed_region"),
        any("rows_per_request"), any("ratio"), any("out"), any("out_lens"), arg("stream") = 0,
        Release());
  bind_config(m);
}

}  // namespace dsv4::python
