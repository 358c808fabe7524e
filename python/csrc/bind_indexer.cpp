// Bindings of the C4A lightning indexer and the C128A plan (include/dsv4/indexer.h): query
// preparation, scores over the caller's indexer key cache, top-k, and the compressed-prefix
// indices — the pieces of vLLM's Indexer module, each writing caller-allocated outputs.
#include <nanobind/nanobind.h>

#include "dsv4/indexer.h"
#include "tensor_args.h"

namespace dsv4::python {

namespace {

using nb::arg;
using Release = nb::call_guard<nb::gil_scoped_release>;

// The argument order is the Python ops' (torch.ops.dsv4, the Triton backend): qr_scale last.
void indexer_query_op(const TensorArg& qr, const TensorArg& wq_b, const TensorArg& wq_b_scale,
                      const TensorArg& x, const TensorArg& weights_proj,
                      const TensorArg& positions, const TensorArg& cos_sin,
                      const TensorArg& q_fp8, const TensorArg& q_scale, const TensorArg& weights,
                      const TensorArg& workspace, const TensorArg& qr_scale, uintptr_t stream) {
  constexpr const char* k = "indexer_query";
  indexer_query(tensor_arg(k, "qr", qr), optional_tensor_arg(k, "qr_scale", qr_scale),
                tensor_arg(k, "wq_b", wq_b), optional_tensor_arg(k, "wq_b_scale", wq_b_scale),
                tensor_arg(k, "x", x), tensor_arg(k, "weights_proj", weights_proj),
                tensor_arg(k, "positions", positions), tensor_arg(k, "cos_sin", cos_sin),
                tensor_arg(k, "q_fp8", q_fp8), tensor_arg(k, "q_scale", q_scale),
                tensor_arg(k, "weights", weights), optional_tensor_arg(k, "workspace", workspace),
                stream_of(stream));
}

int64_t indexer_query_workspace_bytes_op(const IntArg& tokens, const IntArg& index_heads) {
  constexpr const char* k = "indexer_query_workspace_bytes";
  return indexer_query_workspace_bytes(int64_arg(k, "tokens", tokens, 0),
                                       int_arg(k, "index_heads", index_heads));
}

void indexer_scores_op(const TensorArg& q_fp8, const TensorArg& q_scale, const TensorArg& weights,
                       const TensorArg& positions, const TensorArg& token_to_req,
                       const TensorArg& keys, const IntArg& key_block_size,
                       const TensorArg& key_block_table, const IntArg& ratio,
                       const TensorArg& scores, uintptr_t stream) {
  constexpr const char* k = "indexer_scores";
  IndexerKeyCacheView key_cache;
  key_cache.data = tensor_arg(k, "keys", keys);
  key_cache.block_size = int_arg(k, "key_block_size", key_block_size);
  indexer_scores(tensor_arg(k, "q_fp8", q_fp8), tensor_arg(k, "q_scale", q_scale),
                 tensor_arg(k, "weights", weights), tensor_arg(k, "positions", positions),
                 tensor_arg(k, "token_to_req", token_to_req), key_cache,
                 tensor_arg(k, "key_block_table", key_block_table), int_arg(k, "ratio", ratio),
                 tensor_arg(k, "scores", scores), stream_of(stream));
}

// sorted (torch.topk's word): true = descending score, false = ascending column (TopkOrder).
void indexer_topk_op(const TensorArg& scores, const TensorArg& positions, const IntArg& ratio,
                     const TensorArg& indices, const TensorArg& lens, bool sorted,
                     uintptr_t stream) {
  constexpr const char* k = "indexer_topk";
  indexer_topk(tensor_arg(k, "scores", scores), tensor_arg(k, "positions", positions),
               int_arg(k, "ratio", ratio), tensor_arg(k, "indices", indices),
               optional_tensor_arg(k, "lens", lens), stream_of(stream),
               sorted ? TopkOrder::score : TopkOrder::column);
}

void compressed_prefix_indices_op(const TensorArg& positions, const IntArg& ratio,
                                  const TensorArg& indices, const TensorArg& lens,
                                  uintptr_t stream) {
  constexpr const char* k = "compressed_prefix_indices";
  compressed_prefix_indices(tensor_arg(k, "positions", positions), int_arg(k, "ratio", ratio),
                            tensor_arg(k, "indices", indices),
                            optional_tensor_arg(k, "lens", lens), stream_of(stream));
}

}  // namespace

void bind_indexer(nb::module_& m) {
  const auto any = [](const char* name) { return arg(name).none(); };
  m.def("indexer_query", &indexer_query_op, any("qr"), any("wq_b"), any("wq_b_scale"), any("x"),
        any("weights_proj"), any("positions"), any("cos_sin"), any("q_fp8"), any("q_scale"),
        any("weights"), any("workspace"), any("qr_scale"), arg("stream") = 0, Release());
  m.def("indexer_query_workspace_bytes", &indexer_query_workspace_bytes_op, any("tokens"),
        any("index_heads"));
  m.def("indexer_scores", &indexer_scores_op, any("q_fp8"), any("q_scale"), any("weights"),
        any("positions"), any("token_to_req"), any("keys"), any("key_block_size"),
        any("key_block_table"), any("ratio"), any("scores"), arg("stream") = 0, Release());
  m.def("indexer_topk", &indexer_topk_op, any("scores"), any("positions"), any("ratio"),
        any("indices"), any("lens"), arg("sorted") = true, arg("stream") = 0, Release());
  m.def("compressed_prefix_indices", &compressed_prefix_indices_op, any("positions"),
        any("ratio"), any("indices"), any("lens"), arg("stream") = 0, Release());
}

}  // namespace dsv4::python
