#include "layer_cost_model.h"

#include <algorithm>
#include <array>

#include "dsv4/kv_layout.h"
#include "dsv4/paged_cache.h"
#include "dsv4/status.h"

namespace dsv4::bench {

namespace {

using A = ActivationBytes;

double ceil_div(int64_t a, int64_t b) { return static_cast<double>((a + b - 1) / b); }

// y [T, N] = x [T, K] · Wᵀ with W [N, K]: FLOPs and the bytes of W, x and y.
struct Gemm {
  double flop, bytes;
};
Gemm gemm(double T, int64_t N, int64_t K, bool fp8_weight, int x_bytes, int y_bytes) {
  return {2.0 * T * static_cast<double>(N) * static_cast<double>(K),
          weight_bytes(N, K, fp8_weight) + T * static_cast<double>(K) * x_bytes +
              T * static_cast<double>(N) * y_bytes};
}
// A GEMM of a checkpoint-FP8 weight: FP8 rate and bytes when the weights are FP8.
OpCost fp8_weight_gemm(const StepShape& s, int64_t N, int64_t K, int x_bytes, int y_bytes) {
  const Gemm g = gemm(static_cast<double>(s.tokens), N, K, s.fp8_weights, x_bytes, y_bytes);
  OpCost c;
  (s.fp8_weights ? c.flop_fp8 : c.flop_bf16) = g.flop;
  c.bytes = g.bytes;
  return c;
}

// One compressor (main: head dim D into the KV cache; indexer: 128 into the key cache) over the
// step: the two bf16 projections of x, the ring rows it reads back and saves, the entries it
// emits (normed, roped, quantized into the cache).
OpCost compressor(const StepShape& s, int head_dim, int entry_bytes) {
  const int coff = s.ratio == 4 ? 2 : 1;
  const double T = static_cast<double>(s.tokens);
  const int64_t width = int64_t{coff} * head_dim;
  const Gemm kv = gemm(T, width, s.dim, /*fp8_weight=*/false, A::x, 0);
  OpCost c;
  c.flop_bf16 = 2 * kv.flop;  // wkv and wgate
  const double ring_row = 2.0 * static_cast<double>(width) * 4;  // fp32 [kv | score]
  c.bytes = T * s.dim * A::x + 2 * weight_bytes(width, s.dim, false) +
            static_cast<double>(s.ratio) * static_cast<double>(width) * 4  // ape
            + (s.ring_reads + s.ring_writes) * ring_row +
            s.emitted * (entry_bytes + s.rope_dims * 4.0)  // entries + their cos/sin rows
            + head_dim * 2.0                                 // norm weight
            + T * (A::position + 4);                         // positions, token_to_req
  return c;
}

// Sparse attention over `rows` attended rows: QK and PV per head.
double attention_flop(const StepShape& s, double rows) {
  return 2.0 * s.heads * rows * (s.head_dim + s.v_head_dim);
}

double qo_bytes(const StepShape& s, double tokens) {
  return tokens * s.heads * (s.head_dim + s.v_head_dim) * static_cast<double>(A::q);
}

struct Entry {
  const char* name;
  OpCost (*cost)(const StepShape&);
};

// The op table, in the order the layer runs them. One entry per name the layer marks.
const std::array kTable = {
    Entry{"wq_a", [](const StepShape& s) { return fp8_weight_gemm(s, s.q_lora, s.dim, A::x, A::gemm_out); }},
    Entry{"wkv", [](const StepShape& s) { return fp8_weight_gemm(s, s.head_dim, s.dim, A::x, A::gemm_out); }},
    Entry{"qkv_norm",
          [](const StepShape& s) {
            const double rows = static_cast<double>(s.q_lora + s.head_dim);
            return OpCost{0, 0, s.tokens * rows * (A::gemm_out + A::normed) + rows * 2};
          }},
    Entry{"wq_b",
          [](const StepShape& s) {
            return fp8_weight_gemm(s, int64_t{s.heads} * s.head_dim, s.q_lora, A::normed, A::q);
          }},
    // q head-norm + RoPE in place, kv RoPE + quantize + insert: q and kv read and written, one
    // cache row per token, positions, slots, a cos/sin row per token.
    Entry{"qnorm_rope_kv_insert",
          [](const StepShape& s) {
            const double T = static_cast<double>(s.tokens);
            return OpCost{0, 0,
                          T * (2.0 * s.heads * s.head_dim * A::q + 2.0 * s.head_dim * A::normed +
                               s.kv_token_bytes + 2 * A::position + s.rope_dims * 4.0)};
          }},
    Entry{"compressor",
          [](const StepShape& s) { return compressor(s, s.head_dim, s.kv_token_bytes); }},
    // C128A: every visible entry's number per token ([T, max visible] + lengths).
    Entry{"compressed_indices",
          [](const StepShape& s) {
            return OpCost{0, 0, s.tokens * (s.topk_width * A::index + A::index + A::position)};
          }},
    Entry{"indexer_compressor",
          [](const StepShape& s) { return compressor(s, s.index_head_dim, s.index_key_bytes); }},
    // q = RoPE(qr_n · wq_bᵀ) quantized to FP8 per head, weights = x · weights_projᵀ.
    Entry{"indexer_query",
          [](const StepShape& s) {
            const double T = static_cast<double>(s.tokens);
            const int64_t q_width = int64_t{s.index_heads} * s.index_head_dim;
            const Gemm q = gemm(T, q_width, s.q_lora, s.fp8_weights, A::normed, 0);
            const Gemm w = gemm(T, s.index_heads, s.dim, false, A::x, 0);
            OpCost c;
            (s.fp8_weights ? c.flop_fp8 : c.flop_bf16) = q.flop;
            c.flop_bf16 += w.flop;
            c.bytes = q.bytes + w.bytes +
                      T * (static_cast<double>(q_width) * A::fp8 + 2.0 * s.index_heads * A::scale +
                           s.rope_dims * 4.0 + A::position);
            return c;
          }},
    // FP8 dot products of every token's heads with every visible key; each request's keys read
    // once; the visible scores written.
    Entry{"indexer_scores",
          [](const StepShape& s) {
            const double T = static_cast<double>(s.tokens);
            OpCost c;
            c.flop_fp8 = 2.0 * s.index_heads * s.index_head_dim * s.visible;
            c.bytes = s.key_rows * s.index_key_bytes +
                      T * (static_cast<double>(s.index_heads) * (s.index_head_dim * A::fp8 + 2 * A::scale) +
                           A::position + 4) +
                      s.visible * A::score;
            return c;
          }},
    // Column order (as the layer asks): a token that sees at most index_topk entries takes them
    // all without a read of its scores.
    Entry{"indexer_topk",
          [](const StepShape& s) {
            return OpCost{0, 0,
                          s.topk_scores_read * A::score +
                              s.tokens * (s.topk_width * A::index + A::index + A::position)};
          }},
    // Decode index lists: the SWA window's slots and the compressed entries' global slots.
    Entry{"decode_indices",
          [](const StepShape& s) {
            const double nd = static_cast<double>(s.decodes);
            return OpCost{0, 0, nd * (s.decode_slots * A::index + s.topk_width * A::index + 2 * A::index)};
          }},
    // FP8 sparse decode straight from the caches: each attended row once, q, o, indices, lse.
    Entry{"sparse_decode",
          [](const StepShape& s) {
            const double nd = static_cast<double>(s.decodes);
            OpCost c;
            c.flop_bf16 = attention_flop(s, s.decode_rows);
            c.bytes = s.decode_rows * s.kv_token_bytes + qo_bytes(s, nd) +
                      nd * (s.decode_slots * A::index + A::index + s.heads * 4.0) + s.heads * 4.0;
            return c;
          }},
    // Dequantize each prefill request's (compressed | SWA) rows once into the bf16 workspace.
    Entry{"prefill_gather",
          [](const StepShape& s) {
            return OpCost{0, 0, s.gathered_rows * (s.kv_token_bytes + s.head_dim * 2.0)};
          }},
    Entry{"prefill_indices",
          [](const StepShape& s) {
            const double Tp = static_cast<double>(s.prefill_tokens);
            return OpCost{0, 0, Tp * (s.prefill_slots * A::index + s.topk_width * A::index + A::index)};
          }},
    // bf16 sparse prefill over the workspace: each gathered row once, q, o, indices, lse.
    Entry{"sparse_prefill",
          [](const StepShape& s) {
            const double Tp = static_cast<double>(s.prefill_tokens);
            OpCost c;
            c.flop_bf16 = attention_flop(s, s.prefill_rows);
            c.bytes = s.gathered_rows * s.head_dim * 2.0 + qo_bytes(s, Tp) +
                      Tp * (s.prefill_slots * A::index + A::index + 2.0 * s.heads * 4) + s.heads * 4.0;
            return c;
          }},
    // Inverse RoPE of o in place: only the rope dims move.
    Entry{"inverse_rope",
          [](const StepShape& s) {
            const double T = static_cast<double>(s.tokens);
            return OpCost{0, 0, T * (2.0 * s.heads * s.rope_dims * A::q + s.rope_dims * 4.0 + A::position)};
          }},
    Entry{"act_quant",
          [](const StepShape& s) {
            const double n = static_cast<double>(s.tokens) * s.heads * s.head_dim;
            return OpCost{0, 0, n * (A::q + A::fp8) + n / 128 * A::scale};
          }},
    // One pass: o read, its FP8 codes and 1x128 scales written, the rope dims' cos/sin and the
    // position read per token.
    Entry{"inv_rope_fp8_quant",
          [](const StepShape& s) {
            const double T = static_cast<double>(s.tokens), n = T * s.heads * s.head_dim;
            return OpCost{0, 0, n * (A::q + A::fp8) + n / 128 * A::scale + T * (s.rope_dims * 4.0 + A::position)};
          }},
    Entry{"act_dequant",
          [](const StepShape& s) {
            const double n = static_cast<double>(s.tokens) * s.heads * s.head_dim;
            return OpCost{0, 0, n * (A::fp8 + A::q) + n / 128 * A::scale};
          }},
    // Grouped: G GEMMs [T, H·D/G] · [o_lora, H·D/G]ᵀ, together one [T, H·D] read, [T, G·o_lora]
    // written and G·o_lora·H·D/G parameters.
    Entry{"wo_a",
          [](const StepShape& s) {
            const double T = static_cast<double>(s.tokens);
            const int64_t group_in = int64_t{s.heads} * s.head_dim / s.o_groups;
            OpCost c;
            const double flop = 2.0 * T * s.o_groups * static_cast<double>(s.o_lora) * group_in;
            (s.fp8_weights ? c.flop_fp8 : c.flop_bf16) = flop;
            c.bytes = s.o_groups * weight_bytes(s.o_lora, group_in, s.fp8_weights) +
                      T * static_cast<double>(s.heads) * s.head_dim * A::q +
                      T * s.o_groups * static_cast<double>(s.o_lora) * A::z;
            return c;
          }},
    Entry{"wo_b",
          [](const StepShape& s) {
            return fp8_weight_gemm(s, s.dim, int64_t{s.o_groups} * s.o_lora, A::z, A::y);
          }},
    // Tensor parallelism's in-place sum of y over the ranks: at least y read and the sum written
    // once on this rank's HBM. The link transfers (NVLink, ~2·(tp−1)/tp of y per rank for a ring)
    // have no measured ceiling here, so this floor understates the op by their time.
    Entry{"tp_allreduce",
          [](const StepShape& s) { return OpCost{0, 0, 2.0 * s.tokens * s.dim * A::y}; }},
};

}  // namespace

double weight_bytes(int64_t rows, int64_t cols, bool fp8) {
  const double n = static_cast<double>(rows) * static_cast<double>(cols);
  return fp8 ? n + ceil_div(rows, 128) * ceil_div(cols, 128) : 2 * n;
}

double OpCost::floor_us(const Ceilings& c) const {
  auto need = [](double v, const char* name) {
    if (!(v > 0)) fail("bench layer: the ", name, " ceiling must be > 0 to compute a floor, got ", v);
  };
  need(c.copy_gbps, "copy");
  double compute_s = 0;
  if (flop_fp8 > 0) {
    need(c.fp8_tflops, "FP8 tensor-core");
    compute_s += flop_fp8 / (c.fp8_tflops * 1e12);
  }
  if (flop_bf16 > 0) {
    need(c.bf16_tflops, "bf16 tensor-core");
    compute_s += flop_bf16 / (c.bf16_tflops * 1e12);
  }
  const double memory_s = bytes / (c.copy_gbps * 1e9);
  return 1e6 * std::max(compute_s, memory_s);
}

std::string OpCost::bound(const Ceilings& c) const {
  const double compute_s = (flop_fp8 > 0 ? flop_fp8 / (c.fp8_tflops * 1e12) : 0) +
                           (flop_bf16 > 0 ? flop_bf16 / (c.bf16_tflops * 1e12) : 0);
  if (compute_s <= bytes / (c.copy_gbps * 1e9)) return "memory";
  return flop_fp8 >= flop_bf16 ? "fp8" : "bf16";
}

StepShape StepShape::make(const ModelConfig& cfg, LayerKind kind, const BatchPlan& plan,
                          bool fp8_weights) {
  StepShape s;
  s.dim = cfg.dim;
  s.heads = cfg.n_heads;
  s.head_dim = cfg.head_dim;
  s.rope_dims = cfg.rope_head_dim;
  s.v_head_dim = cfg.v_head_dim;
  s.q_lora = cfg.q_lora_rank;
  s.o_groups = cfg.o_groups;
  s.o_lora = cfg.o_lora_rank;
  s.window = cfg.window_size;
  s.index_heads = cfg.index_n_heads;
  s.index_head_dim = cfg.index_head_dim;
  s.index_topk = cfg.index_topk;
  s.ratio = kind == LayerKind::swa ? 0 : kind == LayerKind::c4a ? 4 : 128;
  s.kv_token_bytes = model1::kTokenBytes;
  s.index_key_bytes = CacheDefaults::kIndexerKeyRowBytes;
  s.fp8_weights = fp8_weights;

  const int64_t W = cfg.window_size, r = s.ratio;
  const int coff = r == 4 ? 2 : 1;
  s.tokens = plan.num_tokens();
  s.requests = plan.num_requests();
  int64_t max_visible = 0;
  for (int i = 0; i < plan.num_requests(); ++i) max_visible = std::max(max_visible, r > 0 ? plan.seq_len(i) / r : 0);
  s.topk_width = r == 4 ? cfg.index_topk : r == 128 ? static_cast<double>(max_visible) : 0;
  for (int i = 0; i < plan.num_requests(); ++i) {
    const RequestStep& st = plan.requests[i];
    const int64_t ctx = st.context, seq = st.context + st.num_new;
    const bool decode = i < plan.num_decode_like;  // attended token by token, as the layer does
    double rows = 0;
    for (int64_t p = ctx; p < seq; ++p) {
      const int64_t visible = r > 0 ? (p + 1) / r : 0;
      const int64_t attended = r == 4 ? std::min<int64_t>(cfg.index_topk, visible) : visible;
      rows += static_cast<double>(std::min(W, p + 1) + attended);
      if (r == 4) s.visible += static_cast<double>(visible);
      if (r == 4 && visible > cfg.index_topk) s.topk_scores_read += static_cast<double>(visible);
    }
    if (decode) {
      s.decodes += st.num_new;
      s.decode_rows += rows;
    } else {
      ++s.prefill_requests;
      s.prefill_tokens += st.num_new;
      s.prefill_rows += rows;
      // The layer gathers the request's last min(seq, num_new + W - 1) SWA rows and all its
      // compressed entries once, for all its tokens.
      s.gathered_rows += static_cast<double>(std::min(seq, st.num_new + W - 1) + (r > 0 ? seq / r : 0));
    }
    if (r == 4) s.key_rows += static_cast<double>(seq / 4);
    if (r > 0) {
      const int64_t first = ctx / r, after = seq / r;  // entries [first, after) are emitted now
      s.emitted += static_cast<double>(after - first);
      const int64_t ring = int64_t{coff} * r;
      s.ring_writes += static_cast<double>(std::min(st.num_new, ring));
      if (after > first && ctx > 0) {
        const int64_t window_start = std::max<int64_t>(0, (first - (coff - 1)) * r);
        s.ring_reads += static_cast<double>(std::max<int64_t>(0, ctx - window_start));
      }
    }
  }
  s.decode_slots = static_cast<double>(W) + s.topk_width;
  s.prefill_slots = s.decode_slots;
  return s;
}

std::optional<OpCost> op_cost(std::string_view op, const StepShape& s) {
  for (const Entry& e : kTable)
    if (op == e.name) return e.cost(s);
  return std::nullopt;
}

std::vector<std::string> modeled_ops() {
  std::vector<std::string> names;
  for (const Entry& e : kTable) names.emplace_back(e.name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace dsv4::bench
