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

nb::dict geometry_op(const std::string& layout, int block_size) {
  const KvGeometry g = kv_geometry(parse_kv_layout(layout), block_size);
  nb::dict d;
  d["layout"] = std::string(kv_layout_name(g.layout));
  d["block_size"] = g.block_size;
  d["dim"] = g.dim;
  d["token_bytes"] = g.token_bytes;
  d["block_bytes"] = g.block_bytes;
  return d;
}

void kv_quantize_op(const AnyArray& cache, const std::string& layout, int block_size,
                    float tensor_scale, const AnyArray& values, const AnyArray& slots) {
  kv_quantize(cache_of(cache, layout, block_size, tensor_scale, "cache"),
              view_of(values, "values"), view_of(slots, "slots"));
}

void kv_dequantize_op(const AnyArray& cache, const std::string& layout, int block_size,
                      float tensor_scale, const AnyArray& slots, const AnyArray& out) {
  kv_dequantize(cache_of(cache, layout, block_size, tensor_scale, "cache"),
                view_of(slots, "slots"), view_of(out, "out"));
}

void local_to_global_op(const AnyArray& local, const AnyArray& token_to_req,
                        const AnyArray& block_table, int block_size, const AnyArray& global,
                        const OptArray& lens, bool checked, uintptr_t stream) {
  const TensorView l = view_of(local, "local"), r = view_of(token_to_req, "token_to_req");
  const TensorView b = view_of(block_table, "block_table"), g = view_of(global, "global");
  const TensorView n = view_of(lens, "lens");
  if (checked) local_to_global_slots_checked(l, r, b, block_size, g, n);
  else local_to_global_slots(l, r, b, block_size, g, n, stream_of(stream));
}

void swa_window_op(const AnyArray& positions, const AnyArray& token_to_req,
                   const AnyArray& block_table, int block_size, int window,
                   const AnyArray& indices, const AnyArray& lens, uintptr_t stream) {
  swa_window_indices(view_of(positions, "positions"), view_of(token_to_req, "token_to_req"),
                     view_of(block_table, "block_table"), block_size, window,
                     view_of(indices, "indices"), view_of(lens, "lens"), stream_of(stream));
}

void combine_topk_swa_op(const AnyArray& topk, const AnyArray& query_start_loc,
                         const AnyArray& seq_lens, const AnyArray& gather_lens, int window,
                         int compressed_region, int64_t rows_per_request, int ratio,
                         const AnyArray& out, const AnyArray& out_lens, uintptr_t stream) {
  combine_topk_swa_indices(view_of(topk, "topk"), view_of(query_start_loc, "query_start_loc"),
                           view_of(seq_lens, "seq_lens"), view_of(gather_lens, "gather_lens"),
                           window, compressed_region, rows_per_request, ratio,
                           view_of(out, "out"), view_of(out_lens, "out_lens"), stream_of(stream));
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
           [](const ModelConfig& c, int layer) {
             return std::string(layer_kind_name(c.layer_kind(layer)));
           },
           arg("layer"), "\"SWA\", \"C4A\" or \"C128A\"")
      .def("compress_ratio", &ModelConfig::compress_ratio, arg("layer"))
      .def("rope_for_layer",
           [](const ModelConfig& c, int layer) { return rope_dict(c.rope_for_layer(layer)); },
           arg("layer"))
      .def("validate", &ModelConfig::validate)
      .def("describe", [](const ModelConfig& c) { return describe(c); })
      .def("__repr__",
           [](const ModelConfig& c) { return "<dsv4attn.ModelConfig " + c.name + ">"; });
}

}  // namespace

void bind_cache(nb::module_& m) {
  const auto none = [](const char* name) { return arg(name).none(); };
  m.def("kv_geometry", &geometry_op, arg("layout"), arg("block_size"),
        "Byte geometry of a cache layout at a block size (dict)");
  m.def("kv_quantize", &kv_quantize_op, arg("cache"), arg("layout"), arg("block_size"),
        arg("tensor_scale"), arg("values"), arg("slots"), Release());
  m.def("kv_dequantize", &kv_dequantize_op, arg("cache"), arg("layout"), arg("block_size"),
        arg("tensor_scale"), arg("slots"), arg("out"), Release());
  m.def("local_to_global_slots", &local_to_global_op, arg("local"), arg("token_to_req"),
        arg("block_table"), arg("block_size"), arg("global_"), none("lens"),
        arg("checked") = false, arg("stream") = 0, Release());
  m.def("swa_window_indices", &swa_window_op, arg("positions"), arg("token_to_req"),
        arg("block_table"), arg("block_size"), arg("window"), arg("indices"), arg("lens"),
        arg("stream") = 0, Release());
  m.def("combine_topk_swa_indices", &combine_topk_swa_op, arg("topk"), arg("query_start_loc"),
        arg("seq_lens"), arg("gather_lens"), arg("window"), arg("compressed_region"),
        arg("rows_per_request"), arg("ratio"), arg("out"), arg("out_lens"), arg("stream") = 0,
        Release());
  bind_config(m);
}

}  // namespace dsv4::python
