// Regressions of the bugs the op fuzzer (tests/fuzz, `dsv4_fuzz`) found, one test each, written
// as the fuzzer drew them: the call must throw dsv4::Error naming the argument, and no byte of any
// buffer the call could write may change.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dsv4/indexer.h"
#include "dsv4/ops.h"
#include "dsv4/status.h"
#include "dsv4/synthetic.h"

namespace {

using dsv4::DType;
using dsv4::HostTensor;
using dsv4::TensorView;

// Runs `call`, which must throw dsv4::Error containing `part`, and checks that every buffer in
// `written` kept its bytes.
void expect_rejected(const std::function<void()>& call, const std::string& part,
                     const std::vector<const HostTensor*>& written) {
  std::vector<std::vector<uint8_t>> before;
  for (const HostTensor* b : written)
    before.emplace_back(b->data<uint8_t>(), b->data<uint8_t>() + b->nbytes());
  try {
    call();
    ADD_FAILURE() << "expected dsv4::Error containing '" << part << "'";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
  for (size_t k = 0; k < written.size(); ++k)
    EXPECT_EQ(0, std::memcmp(written[k]->data<uint8_t>(), before[k].data(), before[k].size()))
        << "buffer " << k << " changed although the call was rejected";
}

HostTensor poisoned(DType t, std::vector<int64_t> dims) {
  HostTensor h(t, std::move(dims));
  h.fill_bytes(0x5A);
  return h;
}

// inv_rope_fp8_quant checked its outputs against o only: an o_scale lying over `positions` was
// accepted, and the scales it wrote became positions that indexed far outside cos_sin (SIGSEGV).
TEST(FuzzRegressions, InvRopeFp8QuantScaleOverPositions) {
  const int64_t T = 4, H = 2, D = 512, block = 64;
  const HostTensor o = HostTensor::zeros(DType::bf16, {T, H, D});
  const HostTensor cos_sin = dsv4::build_rope_cache(dsv4::RopeConfig{}, 34);
  HostTensor fp8 = poisoned(DType::fp8_e4m3, {T, H * D});
  // One buffer: positions (int64 [T]) at its start, o_scale (ue8m0 [T, H*D/block]) over it.
  HostTensor shared = HostTensor::zeros(DType::uint8, {T * H * D / block});
  TensorView positions(shared.data<uint8_t>(), DType::int64, {T});
  TensorView o_scale(shared.data<uint8_t>(), DType::ue8m0, {T, H * D / block});
  expect_rejected(
      [&] { dsv4::inv_rope_fp8_quant(o, positions, cos_sin, block, fp8, o_scale); },
      "inv_rope_fp8_quant: o_scale: expected memory disjoint from positions", {&fp8, &shared});
}

// A negative dim passed the ops' wildcard shape checks: indexer_topk looped over indices [T, -1]
// (SIGSEGV), synthetic_hidden sized a row buffer from out [T, -1] (std::length_error inside an
// OpenMP region: std::terminate). Every shape check now refuses a negative size.
TEST(FuzzRegressions, NegativeDimIndexerTopk) {
  const HostTensor scores = HostTensor::zeros(DType::fp32, {3, 1});
  const HostTensor positions = HostTensor::zeros(DType::int32, {3});
  HostTensor indices = poisoned(DType::int32, {3, 4});
  TensorView bad = indices.view();
  bad.shape[1] = -1;
  expect_rejected([&] { dsv4::indexer_topk(scores, positions, 7, bad); },
                  "indexer_topk: indices.shape[1]: expected a size >= 0, got -1", {&indices});
}

TEST(FuzzRegressions, NegativeDimSyntheticHidden) {
  const HostTensor req = HostTensor::zeros(DType::int64, {3});
  const HostTensor pos = HostTensor::zeros(DType::int64, {3});
  HostTensor out = poisoned(DType::bf16, {3, 64});
  TensorView bad = out.view();
  bad.shape[1] = -1;
  expect_rejected([&] { dsv4::synthetic_hidden(req, pos, 771, bad); },
                  "synthetic_hidden: out.shape[1]: expected a size >= 0, got -1", {&out});
}

}  // namespace
