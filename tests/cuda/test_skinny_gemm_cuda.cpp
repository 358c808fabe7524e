// The skinny decode GEMM's own guarantees (src/cuda/gemm/skinny_gemm.h), reached through
// src/runtime/gemm_path.h (the kernel forced, with its token tile and K splits chosen):
//   - SkinnyGemmTokenTiles: one problem at one split count gives the same bytes on the token tiles
//     of 16, 32, 64 and 128 tokens. Each output is one CTA's fp32 products of each 128-deep K block
//     (fp8) or 64-deep one (bf16), promoted / accumulated in K-block order, then the splits added in
//     order; neither the tile's width (the wgmma N), nor how many tiles T takes, nor the pipelining
//     of the products may change a bit — so the wide tiles compute exactly what the 16 / 32-token
//     tiles of the automatic path do. Also within tolerance of the CPU op, so a result equally
//     wrong on every tile fails;
//   - SkinnyGemmSanitizer: small problems on every tile, one and several splits, padded tokens and
//     more than one token tile, fp8 and bf16, against the CPU op — quick enough to run under
//     compute-sanitizer (docs/notes/skinny-gemm.md has the command);
//   - SkinnyGemmForced: a problem the kernel does not take, forced onto it, is refused with an
//     error naming the op, and nothing is written.
// Tolerances: fp8, the FP8 GEMM rule (fp8_gemm_test_util.h: 2e-3 · Σ|x w| + one bf16 ulp); bf16,
// against float64, gemm_tolerance (cpu/dense_operands.h: 1e-5 · Σ|x w|; fp32 outputs here).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/fp8_gemm_test_util.h"
#include "cuda/gpu_test_util.h"
#include "dsv4/device_tensor.h"
#include "dsv4/ops.h"
#include "runtime/gemm_path.h"

namespace {
using namespace fp8_gemm_test;
using dsv4::rt::GemmChoice;
using dsv4::rt::GemmPath;

constexpr int kTokenTiles[] = {16, 32, 64, 128};

// An FP8 problem on the device: linear (G 0) or grouped_wo_a (G groups of N × K), its CPU result
// and Σ|x w| per output.
struct Fp8Problem {
  int64_t G, N, K, T;
  Fp8Activation x;
  Fp8Weight w;
  DeviceTensor xd, xsd, wd, wsd;
  HostTensor y_cpu, sums;

  Fp8Problem(int64_t G_, int64_t N_, int64_t K_, int64_t T_, uint64_t seed)
      : G(G_), N(N_), K(K_), T(T_), x(make_activation(T_, groups() * K_, seed)), w(make_weight(G_, N_, K_, seed + 1)) {
    xd = DeviceTensor::from_host(x.codes);
    xsd = DeviceTensor::from_host(x.scale_t);
    wd = DeviceTensor::from_host(w.op.values);
    wsd = DeviceTensor::from_host(w.cuda_scale);
    y_cpu = poisoned(DType::fp32, {T, groups() * N});
    if (G > 0) {
      dsv4::grouped_wo_a(x.codes, x.host_scale(), w.op.values, w.op.scale, y_cpu);
      sums = grouped_abs_sums(x, w, T, G, N, K);
    } else {
      dsv4::linear(x.codes, x.host_scale(), w.op.values, w.op.scale, y_cpu);
      sums = abs_sums(x.real, w.real, T, N);
    }
  }
  int64_t groups() const { return std::max<int64_t>(G, 1); }
  // The CUDA result (fp32) with the kernel forced as `choice` says.
  HostTensor run(const GemmChoice& choice, const DeviceTensor& work) const {
    DeviceTensor y = poisoned_device(DType::fp32, {T, groups() * N});
    const TensorView ws = scale_window(wsd, K / 128);
    if (G > 0)
      dsv4::rt::grouped_wo_a_on_path(choice, xd, transposed(xsd.view()), wd, ws, y, work, nullptr);
    else
      dsv4::rt::linear_on_path(choice, xd, transposed(xsd.view()), wd, ws, y, work, nullptr);
    return synced_to_host(y);
  }
};

// A bf16 linear on the device, its float64 reference.
struct Bf16Problem {
  int64_t N, K, T;
  Operand x, w;
  DeviceTensor xd, wd;
  GemmReference ref;

  Bf16Problem(int64_t N_, int64_t K_, int64_t T_, uint64_t seed)
      : N(N_), K(K_), T(T_), x(make_operand(Enc::bf16, 0, T_, K_, 1, 1, seed)),
        w(make_operand(Enc::bf16, 0, N_, K_, 1, 1, seed + 1)) {
    xd = DeviceTensor::from_host(x.values);
    wd = DeviceTensor::from_host(w.values);
    ref = reference_gemm(x.real, 0, K, w.real, 0, T, N, K);
  }
  HostTensor run(const GemmChoice& choice, const DeviceTensor& work) const {
    DeviceTensor y = poisoned_device(DType::fp32, {T, N});
    dsv4::rt::linear_on_path(choice, xd, {}, wd, {}, y, work, nullptr);
    return synced_to_host(y);
  }
  void expect_near_reference(const std::string& what, const HostTensor& y) const {
    int bad = 0;
    for (int64_t i = 0; i < y.numel() && bad < 10; ++i) {
      const double want = ref.y[static_cast<size_t>(i)];
      const double tol = gemm_tolerance(DType::fp32, want, ref.abs_sum[static_cast<size_t>(i)]);
      if (!(std::fabs(at(y, i) - want) <= tol)) {  // NaN (unwritten) fails too
        ADD_FAILURE() << what << " element " << i << ": cuda " << at(y, i) << ", float64 " << want
                      << ", tolerance " << tol;
        ++bad;
      }
    }
  }
};

std::string tile_name(int tile, int64_t splits) {
  return std::to_string(tile) + "-token tiles, " + std::to_string(splits) + " splits asked";
}

// ---- the token tile changes no bit -------------------------------------------------------------
// FP8: 14 K blocks split 3 ways (5, 5, 4) over 5 column tiles at T 32 (today's automatic tile) and
// 100 (one padded 128-token tile, or 2 … 7 narrower ones), one split at T 100 (no reduction: the
// CTAs write y), grouped_wo_a (3 groups, 7 K blocks split 4 + 3) at T 36.
TEST(SkinnyGemmTokenTiles, Fp8SameBitsOnEveryTile) {
  DSV4_SKIP_WITHOUT_GPU();
  const DeviceTensor work(DType::uint8, {dsv4::kGemmWorkspaceBytes});
  const struct { int64_t G, N, K, T, splits; } cases[] = {
      {0, 320, 1792, 32, 3}, {0, 320, 1792, 100, 3}, {0, 320, 1792, 100, 1}, {3, 192, 896, 36, 2}};
  for (const auto& c : cases) {
    const Fp8Problem p(c.G, c.N, c.K, c.T, 70 + c.T);
    const std::string what = "G " + std::to_string(c.G) + ", T " + std::to_string(c.T);
    const HostTensor first = p.run({GemmPath::skinny, c.splits, kTokenTiles[0]}, work);
    expect_fp8_gemm_match(what + ", " + tile_name(kTokenTiles[0], c.splits), p.y_cpu, first, p.sums, DType::fp32);
    for (int tile : kTokenTiles)
      EXPECT_EQ(bytes_of(p.run({GemmPath::skinny, c.splits, tile}, work)), bytes_of(first))
          << what << ": " << tile_name(tile, c.splits) << " differ from " << kTokenTiles[0] << "-token tiles";
  }
}

// bf16: 5 K blocks split 2 ways (3 + 2) over 3 column tiles at T 33 and 130 (two 128-token tiles).
TEST(SkinnyGemmTokenTiles, Bf16SameBitsOnEveryTile) {
  DSV4_SKIP_WITHOUT_GPU();
  const DeviceTensor work(DType::uint8, {dsv4::kGemmWorkspaceBytes});
  for (int64_t T : {33, 130}) {
    const Bf16Problem p(192, 320, T, 80 + T);
    const HostTensor first = p.run({GemmPath::skinny, 2, kTokenTiles[0]}, work);
    p.expect_near_reference("bf16, T " + std::to_string(T), first);
    for (int tile : kTokenTiles)
      EXPECT_EQ(bytes_of(p.run({GemmPath::skinny, 2, tile}, work)), bytes_of(first))
          << "bf16, T " << T << ": " << tile_name(tile, 2) << " differ from " << kTokenTiles[0] << "-token tiles";
  }
}

// ---- small problems for compute-sanitizer ------------------------------------------------------
// Every token tile (T 4 … 132: padded tiles, and two of 128 at 132), one split and two (the
// reduction), one and two K blocks, linear and grouped; fp8 and bf16. Each against the CPU op /
// float64; a race or an out-of-bounds access shows under compute-sanitizer.
TEST(SkinnyGemmSanitizer, Fp8SmallProblems) {
  DSV4_SKIP_WITHOUT_GPU();
  const DeviceTensor work(DType::uint8, {int64_t{1} << 20});
  const struct { int64_t G, N, K; } shapes[] = {{0, 128, 256}, {0, 64, 128}, {2, 64, 256}};
  for (const auto& s : shapes)
    for (int64_t T : {4, 36, 100, 132}) {
      const Fp8Problem p(s.G, s.N, s.K, T, 90 + T);
      for (int64_t splits : {1, 2})
        expect_fp8_gemm_match("G " + std::to_string(s.G) + ", N " + std::to_string(s.N) + ", K " + std::to_string(s.K) +
                                  ", T " + std::to_string(T) + ", " + std::to_string(splits) + " splits",
                              p.y_cpu, p.run({GemmPath::skinny, splits, 0}, work), p.sums, DType::fp32);
    }
}

TEST(SkinnyGemmSanitizer, Bf16SmallProblems) {
  DSV4_SKIP_WITHOUT_GPU();
  const DeviceTensor work(DType::uint8, {int64_t{1} << 20});
  for (int64_t T : {1, 33, 100, 130}) {
    const Bf16Problem p(64, 128, T, 100 + T);
    for (int64_t splits : {1, 2})
      p.expect_near_reference("T " + std::to_string(T) + ", " + std::to_string(splits) + " splits",
                              p.run({GemmPath::skinny, splits, 0}, work));
  }
}

// ---- refusals ------------------------------------------------------------------------------------
TEST(SkinnyGemmForced, RefusesWhatItDoesNotTakeAndWritesNothing) {
  DSV4_SKIP_WITHOUT_GPU();
  const int64_t T = 8;
  const Operand x32 = make_operand(Enc::fp32, 0, T, 128, 1, 1, 1), w32 = make_operand(Enc::fp32, 0, 64, 128, 1, 1, 2);
  const Operand x16 = make_operand(Enc::bf16, 0, T, 128, 1, 1, 3), w16 = make_operand(Enc::bf16, 0, 64, 128, 1, 1, 4);
  const Operand w72 = make_operand(Enc::bf16, 0, 72, 128, 1, 1, 5), wg = make_operand(Enc::bf16, 2, 64, 64, 1, 1, 6);
  const DeviceTensor x32d = DeviceTensor::from_host(x32.values), w32d = DeviceTensor::from_host(w32.values);
  const DeviceTensor x16d = DeviceTensor::from_host(x16.values), w16d = DeviceTensor::from_host(w16.values);
  const DeviceTensor w72d = DeviceTensor::from_host(w72.values), wgd = DeviceTensor::from_host(wg.values);
  DeviceTensor y64 = poisoned_device(DType::fp32, {T, 64}), y72 = poisoned_device(DType::fp32, {T, 72});
  DeviceTensor z = poisoned_device(DType::fp32, {T, 128});
  const GemmChoice skinny{GemmPath::skinny};
  // fp32 operands; N 72, not a multiple of the 64-column tile; a token tile that does not exist;
  // grouped_wo_a's bf16 groups (the kernel takes FP8 groups only there).
  expect_error([&] { dsv4::rt::linear_on_path(skinny, x32d, {}, w32d, {}, y64, {}, nullptr); },
               {"linear", "skinny", "fp32"});
  expect_error([&] { dsv4::rt::linear_on_path(skinny, x16d, {}, w72d, {}, y72, {}, nullptr); },
               {"linear", "skinny", "N 72"});
  expect_error([&] { dsv4::rt::linear_on_path({GemmPath::skinny, 0, 48}, x16d, {}, w16d, {}, y64, {}, nullptr); },
               {"linear", "skinny", "token tile 48"});
  expect_error([&] { dsv4::rt::grouped_wo_a_on_path(skinny, x16d, {}, wgd, {}, z, {}, nullptr); },
               {"grouped_wo_a", "skinny", "FP8"});
  EXPECT_EQ(bytes_of(synced_to_host(y64)), std::vector<uint8_t>(static_cast<size_t>(T * 64 * 4), 0xFF));
  EXPECT_EQ(bytes_of(synced_to_host(y72)), std::vector<uint8_t>(static_cast<size_t>(T * 72 * 4), 0xFF));
  EXPECT_EQ(bytes_of(synced_to_host(z)), std::vector<uint8_t>(static_cast<size_t>(T * 128 * 4), 0xFF));
}

}  // namespace
