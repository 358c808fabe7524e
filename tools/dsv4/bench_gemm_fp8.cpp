// FP8 projection benchmark cases (`dsv4 bench --filter gemm_fp8`): the block-scaled FP8 GEMMs of a
// V4-Flash layer (x 1 × 128 and w 128 × 128 fp32 scales, bf16 out, with a kGemmWorkspaceBytes
// workspace) at prefill (16384 rows, the ops' own kernel choice) and decode sizes, where each
// shape runs on both kernels (src/runtime/gemm_path.h) so the token limit of the automatic choice
// (kSkinnyMaxTokens, src/cuda/gemm/skinny_gemm.h) can be set on measurements:
//   gemm_fp8_<shape>_m<M>_cublaslt          cuBLASLt (wo_a: one matmul per group, fanned out)
//   gemm_fp8_<shape>_m<M>_skinny            the skinny decode GEMM, its own splits and token tile
//   gemm_fp8_<shape>_m<M>_skinny_splits<S>  the same with S K splits (M 64, 128; K ≥ 4096 shapes)
//   gemm_fp8_<shape>_m128_skinny_tile64     the same with 64-token tiles (two per 128 tokens)
// for M in 16, 32, 64, 128, 256. FLOPs 2 · M · N · K; bytes = x + w + y + scales once (the
// floor's count). Decode cases are memory-bound (the weight dominates) and rotate weight sets
// beyond L2; the percent column is against the FP8 tensor-core ceiling (compute-bound) or the copy
// ceiling.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench_harness.h"
#include "dsv4/ops.h"
#include "runtime/device_runtime.h"
#include "runtime/gemm_path.h"
#include "runtime/random_fill.h"

namespace dsv4::bench {
namespace {

struct GemmShape {
  const char* name;
  int64_t groups;  // 0: linear; G: grouped_wo_a with G groups of N × K
  int64_t N, K;
};

// FP8 codes of random values (rows × cols) through quantize_act_fp8 (realistic codes and scales):
// the codes into `codes`, the fp32 1 × 128 scales into `scale` (any layout).
void random_fp8(void* codes, const TensorView& scale, int64_t rows, int64_t cols, uint64_t seed) {
  auto tmp = device_alloc(static_cast<size_t>(rows * cols * 2));
  rt::fill_random_bf16(tmp.get(), static_cast<size_t>(rows * cols), seed, -1.f, 1.f, nullptr);
  quantize_act_fp8(TensorView(tmp.get(), DType::bf16, {rows, cols}, Device::cuda), 128,
                   TensorView(codes, DType::fp8_e4m3, {rows, cols}, Device::cuda), scale);
  rt::synchronize_device("bench gemm: fp8 fill");
}

// A kernel choice and the suffix it adds to a case's name ("" for the ops' own choice).
struct Variant {
  std::string suffix;
  rt::GemmChoice choice;
};

std::string variant_config(const rt::GemmChoice& choice) {
  std::string text = std::string(", ") + rt::gemm_path_name(choice.path);
  if (choice.skinny_splits > 0) text += ", " + std::to_string(choice.skinny_splits) + " K splits";
  if (choice.skinny_token_tile > 0) text += ", " + std::to_string(choice.skinny_token_tile) + "-token tiles";
  return text;
}

Case make_case(const GemmShape& s, int64_t M, const Variant& v) {
  const int64_t G = std::max<int64_t>(s.groups, 1), N = s.N, K = s.K;
  const int64_t kb = K / 128, nb = (N + 127) / 128, row = fp8_weight_scale_row_stride(K);
  Case c;
  c.name = std::string("gemm_fp8_") + s.name + "_m" + std::to_string(M) + v.suffix;
  c.config = std::to_string(M) + " x " + std::to_string(K) + " x " + std::to_string(N) +
             (s.groups > 0 ? " per group, " + std::to_string(G) + " groups" : std::string()) +
             ", fp8 e4m3 1x128 / 128x128 block scales, bf16 out" + variant_config(v.choice);
  const double weight_bytes = double(G) * (N * K + nb * row * 4);
  c.flops = 2.0 * M * N * K * G;
  c.bytes = weight_bytes + double(M) * K * G + double(M) * kb * G * 4 + double(M) * N * G * 2;
  c.memory_bound = c.flops / c.bytes < kFp8TflopsCeiling * 1e12 / (kHbmGbpsCeiling * 1e9);
  c.fp8 = true;  // measured against the FP8 tensor-core ceiling
  c.rotations = c.memory_bound ? static_cast<int>(std::clamp(std::ceil(2.0 * 50e6 / weight_bytes), 1.0, 64.0)) : 1;
  c.setup = [s, M, G, N, K, kb, nb, row, choice = v.choice, sets = c.rotations]() -> LaunchFn {
    auto x = device_alloc(static_cast<size_t>(M * K * G));
    auto xs = device_alloc(static_cast<size_t>(kb * G * M * 4));
    // x_scale: the transpose of a contiguous [K·G/128, M] buffer (the GEMMs' layout).
    TensorView x_scale(xs.get(), DType::fp32, {kb * G, M}, Device::cuda);
    std::swap(x_scale.shape[0], x_scale.shape[1]);
    std::swap(x_scale.strides[0], x_scale.strides[1]);
    random_fp8(x.get(), x_scale, M, K * G, 1);
    const size_t w_elems = static_cast<size_t>(G * N * K);
    auto w = device_alloc(w_elems * sets);
    auto throwaway = device_alloc(static_cast<size_t>(G * N * kb * 4));
    for (int set = 0; set < sets; ++set)
      random_fp8(static_cast<uint8_t*>(w.get()) + set * w_elems,
                 TensorView(throwaway.get(), DType::fp32, {G * N, kb}, Device::cuda), G * N, K, 100 + set);
    // Weight scales: powers of two, rows padded to `row` (what cuda_weight_scale makes).
    std::vector<float> ws_h(static_cast<size_t>(G * nb * row));
    for (size_t i = 0; i < ws_h.size(); ++i) ws_h[i] = std::ldexp(1.0f, -6 - static_cast<int>(i % 3));
    auto ws = device_alloc(ws_h.size() * 4);
    rt::copy_host_to_device(ws.get(), ws_h.data(), ws_h.size() * 4, "bench gemm: upload w_scale");
    auto y = device_alloc(static_cast<size_t>(M * N * G * 2));
    auto work = device_alloc(static_cast<size_t>(kGemmWorkspaceBytes));
    const TensorView workspace(work.get(), DType::uint8, {kGemmWorkspaceBytes}, Device::cuda);
    const TensorView xv(x.get(), DType::fp8_e4m3, {M, K * G}, Device::cuda);
    const TensorView yv(y.get(), DType::bf16, {M, N * G}, Device::cuda);
    TensorView w_scale(ws.get(), DType::fp32, s.groups > 0 ? std::vector<int64_t>{G, nb, row}
                                                           : std::vector<int64_t>{nb, row}, Device::cuda);
    w_scale.shape[w_scale.ndim - 1] = kb;
    auto keep = std::make_shared<std::vector<std::shared_ptr<void>>>(
        std::vector<std::shared_ptr<void>>{x, xs, w, ws, y, work});
    return [s, G, N, K, w_elems, xv, x_scale, w_scale, yv, workspace, choice, keep](Stream stream, int set) {
      void* w_set = static_cast<uint8_t*>((*keep)[2].get()) + set * w_elems;
      if (s.groups > 0)
        rt::grouped_wo_a_on_path(choice, xv, x_scale, TensorView(w_set, DType::fp8_e4m3, {G, N, K}, Device::cuda),
                                 w_scale, yv, workspace, stream);
      else
        rt::linear_on_path(choice, xv, x_scale, TensorView(w_set, DType::fp8_e4m3, {N, K}, Device::cuda), w_scale,
                           yv, workspace, stream);
    };
  };
  return c;
}

std::vector<Case> gemm_cases() {
  using rt::GemmPath;
  // V4-Flash: dim 4096, q_lora 1024, H·D 64·512, o_groups 8 × o_lora 1024, indexer 64 × 128.
  const GemmShape shapes[] = {
      {"wq_a", 0, 1024, 4096},       {"wkv", 0, 512, 4096},        {"wq_b", 0, 32768, 1024},
      {"indexer_wq_b", 0, 8192, 1024}, {"wo_a_grouped", 8, 1024, 4096}, {"wo_b", 0, 4096, 8192},
  };
  std::vector<Case> cases;
  for (const auto& s : shapes) cases.push_back(make_case(s, 16384, {"", {}}));
  for (int64_t M : {int64_t{16}, int64_t{32}, int64_t{64}, int64_t{128}, int64_t{256}}) {
    for (const auto& s : shapes) {
      cases.push_back(make_case(s, M, {"_cublaslt", {GemmPath::cublaslt, 0, 0}}));
      cases.push_back(make_case(s, M, {"_skinny", {GemmPath::skinny, 0, 0}}));
      // Where the limit is to be decided: other split counts for the deep (K ≥ 4096) shapes, whose
      // split rule caps them (partial sums within half the weight's bytes), and 128 tokens as two
      // 64-token tiles (two CTAs an SM, the weights read twice) against one 128-token tile.
      if ((M == 64 || M == 128) && s.K >= 4096)
        for (int64_t splits : {int64_t{4}, int64_t{8}})
          cases.push_back(make_case(s, M, {"_skinny_splits" + std::to_string(splits), {GemmPath::skinny, splits, 0}}));
      if (M == 128) cases.push_back(make_case(s, M, {"_skinny_tile64", {GemmPath::skinny, 0, 64}}));
    }
  }
  return cases;
}

const Registrar kRegistered("gemm", &gemm_cases);

}  // namespace
}  // namespace dsv4::bench
