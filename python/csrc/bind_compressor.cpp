// Bindings of the KV compressor (include/dsv4/compressor.h): the projection and the state
// update + emission, on views of caller-owned tensors (the ring, the output cache, its block
// tables), so an engine that owns its caches — vLLM's DeepseekCompressor — can drive it.
// The CompressorConfig travels as its fields (head_dim, ratio, rope_dims, eps, target name).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "dsv4/compressor.h"
#include "dsv4/status.h"
#include "tensor_args.h"

namespace dsv4::python {

namespace {

using nb::arg;
using Release = nb::call_guard<nb::gil_scoped_release>;

CompressorTarget parse_target(const char* where, const std::string& target) {
  if (target == "kv_cache") return CompressorTarget::kv_cache;
  if (target == "indexer_keys") return CompressorTarget::indexer_keys;
  fail_expected(where, "target", "\"kv_cache\" or \"indexer_keys\"", "\"" + target + "\"");
}

// The config of one call (the op validates it first, naming the field).
CompressorConfig config_arg(const char* where, const IntArg& head_dim, const IntArg& ratio,
                            const IntArg& rope_dims, float eps, const std::string& target) {
  CompressorConfig cfg;
  cfg.head_dim = int_arg(where, "head_dim", head_dim);
  cfg.ratio = int_arg(where, "ratio", ratio);
  cfg.rope_dims = int_arg(where, "rope_dims", rope_dims);
  cfg.eps = eps;
  cfg.target = parse_target(where, target);
  return cfg;
}

void compressor_project_op(const IntArg& head_dim, const IntArg& ratio, const IntArg& rope_dims,
                           float eps, const std::string& target, const TensorArg& x,
                           const TensorArg& wkv, const TensorArg& wgate, const TensorArg& ape,
                           const TensorArg& positions, const TensorArg& kv_rows,
                           const TensorArg& score_rows, uintptr_t stream) {
  constexpr const char* k = "compressor_project";
  const CompressorConfig cfg = config_arg(k, head_dim, ratio, rope_dims, eps, target);
  compressor_project(cfg, tensor_arg(k, "x", x), tensor_arg(k, "wkv", wkv),
                     tensor_arg(k, "wgate", wgate), tensor_arg(k, "ape", ape),
                     tensor_arg(k, "positions", positions), tensor_arg(k, "kv_rows", kv_rows),
                     tensor_arg(k, "score_rows", score_rows), stream_of(stream));
}

// The output is a KV cache of `out_layout` for target kv_cache, the indexer key cache (uint8
// [blocks, out_block_size * 132]) for indexer_keys (out_layout and out_tensor_scale unused).
void compressor_update_and_emit_op(
    const IntArg& head_dim, const IntArg& ratio, const IntArg& rope_dims, float eps,
    const std::string& target, const TensorArg& kv_rows, const TensorArg& score_rows,
    const TensorArg& positions, const TensorArg& token_to_req, const TensorArg& context_lens,
    const TensorArg& norm_weight, const TensorArg& cos_sin, const TensorArg& state_rows,
    const TensorArg& state_table, const IntArg& state_block_size, const TensorArg& out_cache,
    const TensorArg& out_block_table, const IntArg& out_block_size, const std::string& out_layout,
    float out_tensor_scale, const TensorArg& entries, uintptr_t stream) {
  constexpr const char* k = "compressor_update_and_emit";
  const CompressorConfig cfg = config_arg(k, head_dim, ratio, rope_dims, eps, target);
  const CompressorBatch batch{tensor_arg(k, "positions", positions),
                              tensor_arg(k, "token_to_req", token_to_req),
                              tensor_arg(k, "context_lens", context_lens)};
  const CompressorStateView state{tensor_arg(k, "state_rows", state_rows),
                                  tensor_arg(k, "state_table", state_table),
                                  int_arg(k, "state_block_size", state_block_size)};
  CompressorOutputView out;
  out.block_table = tensor_arg(k, "out_block_table", out_block_table);
  const int block_size = int_arg(k, "out_block_size", out_block_size);
  if (cfg.target == CompressorTarget::kv_cache) {
    out.kv_cache.data = tensor_arg(k, "out_cache", out_cache);
    out.kv_cache.layout = parse_kv_layout(out_layout);
    out.kv_cache.block_size = block_size;
    out.kv_cache.tensor_scale = out_tensor_scale;
  } else {
    out.indexer_keys.data = tensor_arg(k, "out_cache", out_cache);
    out.indexer_keys.block_size = block_size;
  }
  compressor_update_and_emit(cfg, tensor_arg(k, "kv_rows", kv_rows),
                             tensor_arg(k, "score_rows", score_rows), batch,
                             tensor_arg(k, "norm_weight", norm_weight),
                             tensor_arg(k, "cos_sin", cos_sin), state, out,
                             optional_tensor_arg(k, "entries", entries), stream_of(stream));
}

}  // namespace

void bind_compressor(nb::module_& m) {
  const auto any = [](const char* name) { return arg(name).none(); };
  m.def("compressor_project", &compressor_project_op, any("head_dim"), any("ratio"),
        any("rope_dims"), arg("eps"), arg("target"), any("x"), any("wkv"), any("wgate"),
        any("ape"), any("positions"), any("kv_rows"), any("score_rows"), arg("stream") = 0,
        Release());
  m.def("compressor_update_and_emit", &compressor_update_and_emit_op, any("head_dim"),
        any("ratio"), any("rope_dims"), arg("eps"), arg("target"), any("kv_rows"),
        any("score_rows"), any("positions"), any("token_to_req"), any("context_lens"),
        any("norm_weight"), any("cos_sin"), any("state_rows"), any("state_table"),
        any("state_block_size"), any("out_cache"), any("out_block_table"), any("out_block_size"),
        arg("out_layout"), arg("out_tensor_scale"), any("entries"), arg("stream") = 0, Release());
}

}  // namespace dsv4::python
