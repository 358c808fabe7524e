// C4A lightning-indexer benchmark cases (`dsv4 bench --filter indexer`): the FP8 scores (tensor
// cores), the top-k in the layer's order (TopkOrder::column: no sort) and in score order
// (`topk_by_score`, the sorting kernel), and scores + column top-k back to back, at V4-Flash
// shapes (64 index heads × 128 dims, top-512, indexer key blocks of 64 entries, ratio 4):
//   prefill_8x2048_ctx0      16384 tokens: 8 requests × 2048 new tokens from context 0 (N 512)
//   prefill_4x4096_ctx8192   16384 tokens: 4 requests × 4096 new tokens after 8192 cached (N 3072)
//   decode_128_ctx4096       128 requests × 1 token at context 4096 (N 1024)
//   decode_128_ctx65536      128 requests × 1 token at context 65536 (N 16384: the wide top-k)
// Counting: FLOPs = 2 · 64 · 128 per visible (token, key) pair (masked columns not counted).
// Bytes = each request's visible keys once (132 B each: codes + scale), q codes, q_scale and
// weights, the scores written (T · N · 4); top-k: the scores read and the indices written (in
// column order a row whose visible entries all fit in the top-k reads no scores). A case
// is memory-bound when its bytes take longer at the copy ceiling than its FLOPs at the FP8 one.
// Inputs: Gaussian rows through the production quantizers (a host pattern tiled on the device);
// memory-bound cases rotate key sets (other blocks) beyond L2.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_harness.h"
#include "dsv4/fp8_block.h"
#include "dsv4/indexer.h"
#include "dsv4/indexer_key_cache.h"
#include "dsv4/status.h"
#include "runtime/device_runtime.h"

namespace dsv4::bench {
namespace {

constexpr int kHeads = 64, kDim = 128, kTopk = 512, kBlock = 64, kRatio = 4;

struct IndexerShape {
  const char* name;
  int requests, new_tokens, context;  // per request: positions context .. context + new_tokens − 1
};

enum class Part { scores, topk, topk_by_score, both };

struct Counts {
  int64_t T, N, keys_per_request;
  int64_t rows_over_topk;  // rows with more visible entries than the top-k: a select reads them
  double visible_pairs;
};

Counts counts_of(const IndexerShape& s) {
  Counts c;
  c.T = int64_t{s.requests} * s.new_tokens;
  c.N = (int64_t{s.context} + s.new_tokens) / kRatio;
  c.keys_per_request = c.N;
  c.visible_pairs = 0;
  c.rows_over_topk = 0;
  for (int64_t p = s.context; p < int64_t{s.context} + s.new_tokens; ++p) {
    c.visible_pairs += double((p + 1) / kRatio);
    c.rows_over_topk += (p + 1) / kRatio > kTopk;
  }
  c.visible_pairs *= s.requests;
  c.rows_over_topk *= s.requests;
  return c;
}

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Everything one case needs on the device; `sets` key sets (block tables over disjoint blocks).
struct IndexerInputs {
  std::vector<std::shared_ptr<void>> keep;
  TensorView q, q_scale, w, pos, req, scores, indices, lens;
  std::vector<TensorView> tables;
  IndexerKeyCacheView keys;
};

IndexerInputs make_inputs(const IndexerShape& s, const Counts& c, int sets) {
  std::mt19937 rng(2026);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  IndexerInputs in;
  auto own = [&](std::shared_ptr<void> p) {
    in.keep.push_back(p);
    return p.get();
  };
  // Queries: a pattern of 512 tokens' rows (codes, scales, weights), tiled over T.
  constexpr int kPatternTokens = 512;
  std::vector<uint8_t> codes(size_t{kPatternTokens} * kHeads * kDim);
  std::vector<float> scales(size_t{kPatternTokens} * kHeads), weights(scales.size()), row(kDim);
  for (size_t r = 0; r < scales.size(); ++r) {
    const float mag = std::exp(0.5f * normal(rng));
    for (float& x : row) x = normal(rng) * mag;
    scales[r] = exp2_int(fp8_quantize_block(row.data(), kDim, codes.data() + r * kDim));
    weights[r] = 0.3f * normal(rng);
  }
  const int64_t T = c.T;
  in.q = TensorView(own(device_tiled(codes, size_t(T) * kHeads * kDim)), DType::fp8_e4m3, {T, kHeads, kDim},
                    Device::cuda);
  in.q_scale = TensorView(own(device_tiled(bytes_of(scales), size_t(T) * kHeads * 4)), DType::fp32, {T, kHeads},
                          Device::cuda);
  in.w = TensorView(own(device_tiled(bytes_of(weights), size_t(T) * kHeads * 4)), DType::fp32, {T, kHeads},
                    Device::cuda);
  std::vector<int32_t> pos, req;
  for (int r = 0; r < s.requests; ++r)
    for (int i = 0; i < s.new_tokens; ++i) {
      pos.push_back(s.context + i);
      req.push_back(r);
    }
  in.pos = TensorView(own(device_tiled(bytes_of(pos), pos.size() * 4)), DType::int32, {T}, Device::cuda);
  in.req = TensorView(own(device_tiled(bytes_of(req), req.size() * 4)), DType::int32, {T}, Device::cuda);

  // Keys: a pattern of 64 encoded blocks tiled over every set's blocks; set k's requests own
  // blocks [k · blocks_per_set, (k + 1) · blocks_per_set).
  const int64_t blocks_per_request = (c.keys_per_request + kBlock - 1) / kBlock;
  const int64_t blocks_per_set = blocks_per_request * s.requests;
  const int64_t block_bytes = int64_t{kBlock} * indexer_keys::kEntryBytes;
  std::vector<uint8_t> key_pattern(size_t{64} * block_bytes);
  for (int b = 0; b < 64; ++b)
    for (int off = 0; off < kBlock; ++off) {
      const float mag = std::exp(0.5f * normal(rng));
      for (float& x : row) x = normal(rng) * mag;
      indexer_key_encode(key_pattern.data() + b * block_bytes, kBlock, off, row.data());
    }
  const int64_t blocks = blocks_per_set * sets;
  in.keys.data = TensorView(own(device_tiled(key_pattern, size_t(blocks * block_bytes))), DType::uint8,
                            {blocks, block_bytes}, Device::cuda);
  in.keys.block_size = kBlock;
  for (int k = 0; k < sets; ++k) {
    std::vector<int32_t> table(size_t(s.requests) * blocks_per_request);
    std::iota(table.begin(), table.end(), static_cast<int32_t>(k * blocks_per_set));
    std::shuffle(table.begin(), table.end(), rng);
    in.tables.push_back(TensorView(own(device_tiled(bytes_of(table), table.size() * 4)), DType::int32,
                                   {s.requests, blocks_per_request}, Device::cuda));
  }
  in.scores = TensorView(own(device_alloc(size_t(T) * c.N * 4)), DType::fp32, {T, c.N}, Device::cuda);
  in.indices = TensorView(own(device_alloc(size_t(T) * kTopk * 4)), DType::int32, {T, kTopk}, Device::cuda);
  in.lens = TensorView(own(device_alloc(size_t(T) * 4)), DType::int32, {T}, Device::cuda);
  return in;
}

Case make_case(const IndexerShape& s, Part part) {
  const Counts n = counts_of(s);
  const double score_flops = 2.0 * kHeads * kDim * n.visible_pairs;
  const double score_bytes = double(s.requests) * n.keys_per_request * indexer_keys::kEntryBytes +
                             double(n.T) * kHeads * (kDim + 8) + double(n.T) * n.N * 4;
  const bool sorts = part == Part::topk_by_score;  // else the layer's order: TopkOrder::column
  const double rows_read = sorts ? double(n.T) : double(n.rows_over_topk);
  const double topk_bytes = rows_read * n.N * 4 + double(n.T) * (kTopk + 1) * 4;
  const bool topk_only = part == Part::topk || part == Part::topk_by_score;
  Case c;
  const char* part_name = part == Part::scores          ? "scores"
                          : part == Part::topk          ? "topk"
                          : part == Part::topk_by_score ? "topk_by_score"
                                                        : "scores_topk";
  c.name = std::string("indexer_") + part_name + "_" + s.name;
  c.config = "v4-flash indexer: " + std::to_string(s.requests) + " × " + std::to_string(s.new_tokens) +
             " tokens after " + std::to_string(s.context) + " cached, H 64 × 128, N " + std::to_string(n.N) +
             ", top-" + std::to_string(kTopk);
  c.flops = topk_only ? 0.0 : score_flops;
  c.bytes = (topk_only ? 0.0 : score_bytes) + (part == Part::scores ? 0.0 : topk_bytes);
  c.fp8 = true;
  c.memory_bound = c.bytes / (kHbmGbpsCeiling * 1e9) > c.flops / (kFp8TflopsCeiling * 1e12);
  // Memory-bound cases rotate key sets so that one pass over them is 2× the H100's 50 MB L2.
  const double keys_per_set = double(s.requests) * n.keys_per_request * indexer_keys::kEntryBytes;
  c.rotations = c.memory_bound && !topk_only
                    ? static_cast<int>(std::clamp(std::ceil(2.0 * 50e6 / keys_per_set), 1.0, 64.0))
                    : 1;
  // Through the ops' front doors (the CUDA tensors pick the CUDA kernels), as the layer calls them:
  // the timed span includes their argument checks (host work, overlapped by the queued kernels).
  c.setup = [s, n, part, sets = c.rotations]() -> LaunchFn {
    auto in = std::make_shared<IndexerInputs>(make_inputs(s, n, sets));
    auto scores = [in](Stream stream, int set) {
      indexer_scores(in->q, in->q_scale, in->w, in->pos, in->req, in->keys, in->tables[set], kRatio, in->scores,
                     stream);
    };
    const TopkOrder order = part == Part::topk_by_score ? TopkOrder::score : TopkOrder::column;
    auto topk = [in, order](Stream stream) {
      indexer_topk(in->scores, in->pos, kRatio, in->indices, in->lens, stream, order);
    };
    scores(nullptr, 0);  // the top-k alone ranks real scores
    rt::synchronize_device("bench indexer: first scores");
    if (part == Part::scores) return [scores](Stream st, int set) { scores(st, set); };
    if (part == Part::topk || part == Part::topk_by_score) return [topk](Stream st, int) { topk(st); };
    return [scores, topk](Stream st, int set) {
      scores(st, set);
      topk(st);
    };
  };
  return c;
}

std::vector<Case> indexer_cases() {
  const IndexerShape shapes[] = {
      {"prefill_8x2048_ctx0", 8, 2048, 0},
      {"prefill_4x4096_ctx8192", 4, 4096, 8192},
      {"decode_128_ctx4096", 128, 1, 4095},
      {"decode_128_ctx65536", 128, 1, 65535},
  };
  std::vector<Case> cases;
  for (const auto& s : shapes)
    for (Part part : {Part::scores, Part::topk, Part::topk_by_score, Part::both})
      cases.push_back(make_case(s, part));
  return cases;
}

const Registrar kRegistered("indexer", &indexer_cases);

}  // namespace
}  // namespace dsv4::bench
