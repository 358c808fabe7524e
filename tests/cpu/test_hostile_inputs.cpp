// Regressions of issue 21 ("hostile inputs"), each numbered item the C++ library or the `dsv4`
// CLI can reproduce, written the way the hostile user wrote it: an index input lying inside
// memory the op writes, outputs that alias, overflowing sizes and positions, narrowed integers
// in config JSON and CLI flags, unbounded reads. Every rejected call must throw dsv4::Error
// naming the argument before anything is written: each test compares every buffer the call
// could write, byte for byte, with its state before the call. (Items only Python can reach —
// the vllm_ops / flash_mla wrappers, the layer binding, exception types — are in
// tests/python/test_hostile_inputs.py.)
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "args.h"  // tools/dsv4/args.h
#include "cli_test_support.h"
#include "dsv4/batch.h"
#include "dsv4/config.h"
#include "dsv4/indexer.h"
#include "dsv4/indexing.h"
#include "dsv4/kv_layout.h"
#include "dsv4/ops.h"
#include "dsv4/status.h"

namespace {

using dsv4::DType;
using dsv4::HostTensor;
using dsv4::KvCacheView;
using dsv4::KvLayout;
using dsv4::TensorView;

// The bytes of every buffer a rejected call could have written, taken before the call.
class Unchanged {
 public:
  Unchanged(std::initializer_list<const HostTensor*> buffers) {
    for (const HostTensor* b : buffers)
      saved_.emplace_back(b, std::vector<uint8_t>(b->data<uint8_t>(), b->data<uint8_t>() + b->nbytes()));
  }
  void expect() const {
    for (const auto& [b, bytes] : saved_)
      EXPECT_EQ(0, std::memcmp(b->data<uint8_t>(), bytes.data(), bytes.size()))
          << "a buffer changed although the call was rejected";
  }

 private:
  std::vector<std::pair<const HostTensor*, std::vector<uint8_t>>> saved_;
};

// Runs `call`, which must throw dsv4::Error containing every one of `parts`, and checks that the
// buffers in `written` are unchanged.
void expect_rejected(const std::function<void()>& call, const std::vector<std::string>& parts,
                     std::initializer_list<const HostTensor*> written) {
  const Unchanged before(written);
  try {
    call();
    ADD_FAILURE() << "expected dsv4::Error containing '" << parts.front() << "'";
  } catch (const dsv4::Error& e) {
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message '" << e.what() << "' lacks '" << p << "'";
  }
  before.expect();
}

// A view of `t`'s memory from byte `offset` on, as `dtype` with `dims` (contiguous).
TensorView view_into(const HostTensor& t, int64_t offset, DType dtype, std::vector<int64_t> dims) {
  return TensorView(t.data<uint8_t>() + offset, dtype, dims);
}

// MODEL1_FP8 at block size 1: 1152 bytes per block (584 rounded up to 2 x 576).
constexpr int64_t kBlockBytes = 1152;
KvCacheView model1_cache(const HostTensor& bytes) { return {bytes.view(), KvLayout::model1_fp8, 1, 1.0f}; }

HostTensor filled(DType dtype, std::vector<int64_t> dims, float value) {
  HostTensor t(dtype, std::move(dims));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, value);
  return t;
}

HostTensor rope_table(int64_t positions) { return dsv4::build_rope_cache(dsv4::RopeConfig{}, positions); }

// ---- 1. kv_dequantize with `slots` inside `out` (was a SIGSEGV) --------------------------------
TEST(HostileInputs, Item01_KvDequantizeSlotsInsideOut) {
  HostTensor cache = HostTensor::zeros(DType::uint8, {1, kBlockBytes});
  const HostTensor one = filled(DType::fp32, {1, 512}, 3.0f);
  HostTensor slot0 = HostTensor::zeros(DType::int64, {1});
  dsv4::kv_quantize(model1_cache(cache), one, slot0);
  HostTensor out = HostTensor::zeros(DType::fp32, {64, 512});
  const TensorView slots = view_into(out, 0, DType::int32, {64});  // out's first row, as slots
  expect_rejected([&] { dsv4::kv_dequantize(model1_cache(cache), slots, out); },
                  {"kv_dequantize: out: expected memory disjoint from slots"}, {&out, &cache});
}

// ---- 2. kv_quantize with `slots` inside the cache (was a SIGSEGV) ------------------------------
TEST(HostileInputs, Item02_KvQuantizeSlotsInsideCache) {
  HostTensor cache = HostTensor::zeros(DType::uint8, {2, kBlockBytes});
  const TensorView s = view_into(cache, kBlockBytes, DType::int64, {64});  // block 1's bytes
  for (int64_t i = 0; i < 64; ++i) s.ptr<int64_t>()[i] = i == 0 ? 1 : -1;
  const HostTensor values = filled(DType::fp32, {64, 512}, 3.0f);
  expect_rejected([&] { dsv4::kv_quantize(model1_cache(cache), values, s); },
                  {"kv_quantize: cache.data: expected memory disjoint from slots"}, {&cache});
}

// ---- 3. the insert with `slot_mapping` inside the cache, or `positions` inside q -------------
struct InsertCase {
  HostTensor q = HostTensor::zeros(DType::bf16, {64, 1, 512});
  HostTensor kv = HostTensor::zeros(DType::bf16, {64, 512});
  HostTensor positions = HostTensor::zeros(DType::int64, {64});
  HostTensor cos_sin = rope_table(64);
  HostTensor cache = HostTensor::zeros(DType::uint8, {16, kBlockBytes});  // 16 slots
  HostTensor slots = HostTensor::zeros(DType::int64, {64});
  InsertCase() {
    for (int64_t t = 0; t < 64; ++t) slots.data<int64_t>()[t] = t < 16 ? t : -1;
  }
  void run(const TensorView& positions_v, const TensorView& cos_sin_v, const TensorView& slots_v) {
    dsv4::qnorm_rope_kv_insert(q, kv, positions_v, cos_sin_v, 1e-6f, model1_cache(cache), slots_v);
  }
};

TEST(HostileInputs, Item03_InsertSlotMappingInsideCache) {
  InsertCase c;
  const TensorView s = view_into(c.cache, kBlockBytes, DType::int64, {64});
  for (int64_t i = 0; i < 64; ++i) s.ptr<int64_t>()[i] = i == 0 ? 1 : -1;
  expect_rejected([&] { c.run(c.positions, c.cos_sin, s); },
                  {"qnorm_rope_kv_insert: cache.data: expected memory disjoint from slot_mapping"},
                  {&c.q, &c.kv, &c.cache});
}

TEST(HostileInputs, Item03_InsertPositionsInsideQ) {
  InsertCase c;
  const TensorView p = view_into(c.q, 0, DType::int64, {64});  // q is zero: positions 0
  expect_rejected([&] { c.run(p, c.cos_sin, c.slots); },
                  {"qnorm_rope_kv_insert: q: expected memory disjoint from positions"},
                  {&c.q, &c.kv, &c.cache});
  const TensorView p_kv = view_into(c.kv, 0, DType::int64, {64});
  expect_rejected([&] { c.run(p_kv, c.cos_sin, c.slots); },
                  {"qnorm_rope_kv_insert: kv: expected memory disjoint from positions"},
                  {&c.q, &c.kv, &c.cache});
}

// ---- 4. apply_rope with `positions` inside y (was a SIGSEGV) -----------------------------------
TEST(HostileInputs, Item04_ApplyRopePositionsInsideY) {
  const HostTensor x = filled(DType::fp32, {64, 512}, 3.0f);
  HostTensor y = HostTensor::zeros(DType::fp32, {64, 512});
  const TensorView p = view_into(y, 0, DType::int64, {64});
  const HostTensor table = rope_table(1);
  expect_rejected([&] { dsv4::apply_rope(x, p, table, false, y); },
                  {"apply_rope: y: expected memory disjoint from positions"}, {&y});
}

// ---- 5. `dsv4 run --decode-steps 2**63-1`: prompt + steps overflowed past the check (a hang) --
TEST(HostileInputs, Item05_RunHugeDecodeStepsIsAnError) {
  // `timeout` turns a regression (the endless run) into a failure instead of a stuck suite.
  const auto r = dsv4_test::run_cli(
      "run --model tiny --requests 1 --layers 0 --prompt-len 1 --decode-steps "
      "9223372036854775807 --quiet",
      "OMP_NUM_THREADS=1 timeout 60");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("--decode-steps: expected an integer in [0, 65535]"), std::string::npos)
      << r.output;
}

// ---- 6. a batch's size is checked before its plan is built (the binding checks x against
// BatchPlan::count_tokens first; tests/python covers Attention.forward itself) -----------------
TEST(HostileInputs, Item06_BatchPlanCountsBeforeAllocating) {
  using dsv4::BatchPlan;
  using dsv4::RequestStep;
  EXPECT_EQ(BatchPlan::count_tokens({{1, 0, int64_t{1} << 26}, {2, 5, 3}}), (int64_t{1} << 26) + 3);
  const auto error = [](std::vector<RequestStep> steps) {
    try {
      BatchPlan::make(std::move(steps));
    } catch (const dsv4::Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  // More tokens than the int32 offsets hold: refused before any per-token vector is built.
  EXPECT_NE(error({{1, 0, INT32_MAX}, {2, 0, 1}}).find("tokens of one step: expected <= 2147483647"),
            std::string::npos);
  EXPECT_NE(error({{1, INT64_MAX, 1}}).find("context + num_new of request 1"), std::string::npos);
}

// ---- 7. combine_topk_swa_indices: R * rows_per_request overflowed, every row became row 0 -----
TEST(HostileInputs, Item07_CombineTopkSwaRowsOverflow) {
  const HostTensor qsl = HostTensor::from_int32({0, 1, 2, 3, 4});
  const HostTensor seq = HostTensor::from_int32({1, 1, 1, 1}), gather = HostTensor::from_int32({1, 1, 1, 1});
  HostTensor out = HostTensor::zeros(DType::int32, {4, 1}), lens = HostTensor::zeros(DType::int32, {4});
  out.fill_bytes(0xAB);
  lens.fill_bytes(0xAB);
  for (const int64_t m : {int64_t{1} << 62, INT64_MAX, int64_t{1} << 30})
    expect_rejected(
        [&] { dsv4::combine_topk_swa_indices({}, qsl, seq, gather, 1, 0, m, 0, out, lens); },
        {"combine_topk_swa_indices: rows_per_request", "exceed the int32 index range"},
        {&out, &lens});
  expect_rejected([&] { dsv4::combine_topk_swa_indices({}, qsl, seq, gather, 1, 0, -1, 0, out, lens); },
                  {"combine_topk_swa_indices: rows_per_request: expected >= 0, got -1"},
                  {&out, &lens});
  // The largest M that still fits: accepted, rows r * M.
  const int64_t m = INT32_MAX / 4;
  dsv4::combine_topk_swa_indices({}, qsl, seq, gather, 1, 0, m, 0, out, lens);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(out.data<int32_t>()[r], r * m);
}

// ---- overflow-safe position checks beyond the numbered items: the indexer's visible count
// (p + 1) / ratio wrapped negative at p = INT64_MAX and passed the "fits the scores" check ----
TEST(HostileInputs, PositionAtTheInt64EdgeIsChecked) {
  const HostTensor scores = HostTensor::zeros(DType::fp32, {1, 8});
  HostTensor positions(DType::int64, {1});
  positions.data<int64_t>()[0] = INT64_MAX;
  HostTensor indices = HostTensor::zeros(DType::int32, {1, 4}), lens = HostTensor::zeros(DType::int32, {1});
  expect_rejected([&] { dsv4::indexer_topk(scores, positions, 4, indices, lens); },
                  {"indexer_topk: scores.shape[1]: expected >= 2305843009213693952"},
                  {&indices, &lens});
}

// ---- 9. ModelConfig JSON integers are exact -----------------------------------------------------
// A valid tiny V4 config.json (inference spelling) with `key` set to the JSON text `value`
// (added when absent); the error it gives, or "<no error, dim D>".
std::string config_error(const std::string& key, const std::string& value) {
  std::vector<std::pair<std::string, std::string>> fields = {
      {"dim", "256"}, {"n_heads", "16"}, {"n_layers", "4"}, {"q_lora_rank", "128"},
      {"head_dim", "512"}, {"rope_head_dim", "64"}, {"o_groups", "4"}, {"o_lora_rank", "64"},
      {"window_size", "16"}, {"compress_ratios", "[0, 4, 128, 4]"}, {"index_n_heads", "4"},
      {"index_head_dim", "128"}, {"index_topk", "16"}, {"max_seq_len", "65536"}};
  bool replaced = false;
  for (auto& [k, v] : fields)
    if (k == key) v = value, replaced = true;
  if (!replaced) fields.emplace_back(key, value);
  std::string json = "{";
  for (const auto& [k, v] : fields) json += (json.size() > 1 ? ", \"" : "\"") + k + "\": " + v;
  json += "}";
  try {
    const dsv4::ModelConfig c = dsv4::ModelConfig::from_json_string(json, "hostile");
    return "<no error, dim " + std::to_string(c.dim) + ">";
  } catch (const dsv4::Error& e) {
    return e.what();
  }
}

TEST(HostileInputs, Item09_ConfigJsonIntegersAreExact) {
  EXPECT_EQ(config_error("dim", "256"), "<no error, dim 256>");  // the base config is valid
  EXPECT_EQ(config_error("dim", "256.0"), "<no error, dim 256>");  // an integral number is exact
  const std::string range = "expected an integer in [-2147483648, 2147483647]";
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"dim", "4294967552"},                      // was 256 (low 32 bits)
           {"compress_ratios", "[0, 4, 4294967300, 4]"},  // was 4: layer 2 turned C4A
           {"dim", "true"},                            // was 1
           {"index_topk", "1.5"},                      // was 1
           {"dim", "-2147483649"},
           {"n_layers", "1e300"}}) {
    const std::string err = config_error(key, value);
    EXPECT_NE(err.find("config 'hostile': key '" + key), std::string::npos) << err;
    EXPECT_NE(err.find(range), std::string::npos) << err;
  }
  EXPECT_NE(config_error("compress_ratios", "[0, 4, 4294967300, 4]").find("key 'compress_ratios[2]'"),
            std::string::npos);
  EXPECT_NE(config_error("index_topk", "1.5").find("got 1.5"), std::string::npos);
  // Floating-point fields take finite numbers, not booleans.
  const std::string eps = config_error("norm_eps", "true");
  EXPECT_NE(eps.find("key 'norm_eps': expected a finite number, got true"), std::string::npos) << eps;
}

// ---- 10. CLI integers are exact; --tolerance is a finite positive number -----------------------
TEST(HostileInputs, Item10_CliFlagsAreExact) {
  using dsv4::cli::parse_args;
  const std::vector<dsv4::cli::FlagSpec> flags = {{"requests", true, ""}, {"tolerance", true, ""},
                                                  {"lens", true, ""}};
  const auto error = [&](std::vector<std::string> argv, const std::function<void(const dsv4::cli::ParsedArgs&)>& get) {
    try {
      get(parse_args("run", argv, flags));
    } catch (const dsv4::Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  const auto requests = [](const dsv4::cli::ParsedArgs& a) { a.get_int("requests", 4, 1, INT_MAX); };
  EXPECT_EQ(error({"--requests", "4294967297"}, requests),  // was 1 request (low 32 bits)
            "--requests: expected an integer in [1, 2147483647], got 4294967297");
  EXPECT_EQ(error({"--requests", "99999999999999999999"}, requests),
            "--requests: expected an integer in [1, 2147483647], got 99999999999999999999");
  for (const char* text : {" 12", "+12", "12x", "1e3", "", "-"})
    EXPECT_NE(error({"--requests", text}, requests).find("expected an integer"), std::string::npos) << text;
  EXPECT_EQ(error({"--requests", "12"}, requests), "<no error>");
  const auto lens = [](const dsv4::cli::ParsedArgs& a) { a.get_int_list("lens", {}, 1, 100); };
  EXPECT_EQ(error({"--lens", "1,101"}, lens), "--lens: expected an integer in [1, 100], got 101");
  const auto tolerance = [](const dsv4::cli::ParsedArgs& a) { a.get_positive_double("tolerance", 1); };
  for (const char* text : {"nan", "-1", "inf", "0", "-inf"})
    EXPECT_EQ(error({"--tolerance", text}, tolerance),
              std::string("--tolerance: expected a finite number > 0, got '") + text + "'");
  EXPECT_EQ(error({"--tolerance", "1e-3"}, tolerance), "<no error>");

  // End to end: `dsv4 run` refuses them before running anything.
  for (const char* args : {"--requests 4294967297", "--tolerance nan", "--tolerance -1",
                           "--tolerance inf", "--chunk 4294967296", "--seed -1"}) {
    const auto r = dsv4_test::run_cli(std::string("run --model tiny --layers 0 --prompt-len 1 --quiet ") + args,
                                      "OMP_NUM_THREADS=1 timeout 60");
    EXPECT_EQ(r.status, 1) << args << ": " << r.output;
    EXPECT_NE(r.output.find("expected"), std::string::npos) << args << ": " << r.output;
  }
}

// ---- 11. make_decode_schedule: split_len overflowed int (-2147483648) -------------------------
TEST(HostileInputs, Item11_DecodeScheduleFitsInt) {
  const dsv4::DecodeSchedule s = dsv4::make_decode_schedule(1, 1, 1, INT_MAX, 1, 576);
  EXPECT_GT(s.split_len, 0);
  EXPECT_EQ(s.split_len % dsv4::kDecodeTile, 0);
  EXPECT_GE(int64_t{s.num_splits} * s.split_len, INT_MAX);
  // Shapes whose workspace does not fit int64 are an error, not a wrapped byte count.
  try {
    dsv4::make_decode_schedule(INT_MAX, INT_MAX, INT_MAX, 64, 132, INT_MAX);
    ADD_FAILURE() << "expected an overflow error";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find("make_decode_schedule: workspace bytes"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("overflows int64"), std::string::npos) << e.what();
  }
}

// ---- 12. aliasing that was accepted, where the output depended on write order -----------------
TEST(HostileInputs, Item12_KvDequantizeOutputAliasing) {
  HostTensor cache = HostTensor::zeros(DType::uint8, {4, kBlockBytes});
  const HostTensor slots = HostTensor::zeros(DType::int64, {4});
  HostTensor out = HostTensor::zeros(DType::fp32, {4, 512});
  out.fill_bytes(0x7F);
  TensorView expanded = out.view();  // stride-0 rows: four rows, one address
  expanded.strides[0] = 0;
  expect_rejected([&] { dsv4::kv_dequantize(model1_cache(cache), slots, expanded); },
                  {"kv_dequantize: out: expected an output whose elements do not overlap"}, {&out});
  TensorView overlapping = out.view();  // rows 256 floats apart, 512 long
  overlapping.shape[0] = 2;
  overlapping.strides[0] = 256;
  const HostTensor two_slots = HostTensor::zeros(DType::int64, {2});
  expect_rejected([&] { dsv4::kv_dequantize(model1_cache(cache), two_slots, overlapping); },
                  {"kv_dequantize: out: expected an output whose elements do not overlap"}, {&out});
  // out inside the cache it reads.
  const TensorView out_in_cache = view_into(cache, 2 * kBlockBytes, DType::bf16, {1, 512});
  const HostTensor slot0 = HostTensor::zeros(DType::int64, {1});
  expect_rejected([&] { dsv4::kv_dequantize(model1_cache(cache), slot0, out_in_cache); },
                  {"kv_dequantize: out: expected memory disjoint from cache.data"}, {&cache});
}

TEST(HostileInputs, Item12_KvQuantizeValuesInsideCache) {
  HostTensor cache = HostTensor::zeros(DType::uint8, {4, kBlockBytes});
  const TensorView values = view_into(cache, 2 * kBlockBytes, DType::bf16, {1, 512});
  const HostTensor slot0 = HostTensor::zeros(DType::int64, {1});
  expect_rejected([&] { dsv4::kv_quantize(model1_cache(cache), values, slot0); },
                  {"kv_quantize: cache.data: expected memory disjoint from values"}, {&cache});
}

TEST(HostileInputs, Item12_InsertCosSinInsideCache) {
  InsertCase c;  // cos_sin [64, 64] fp32 = 16 KiB, inside the 18 KiB cache
  const TensorView table = view_into(c.cache, 0, DType::fp32, {64, 64});
  std::memcpy(table.data, c.cos_sin.data<uint8_t>(), c.cos_sin.nbytes());
  expect_rejected([&] { c.run(c.positions, table, c.slots); },
                  {"qnorm_rope_kv_insert: cache.data: expected memory disjoint from cos_sin"},
                  {&c.q, &c.kv, &c.cache});
}

TEST(HostileInputs, Item12_ApplyRopeCosSinInsideY) {
  const HostTensor x = filled(DType::fp32, {4, 512}, 3.0f);
  HostTensor y = HostTensor::zeros(DType::fp32, {4, 512});
  const HostTensor table = rope_table(1);
  const TensorView in_y = view_into(y, 3 * 512 * 4, DType::fp32, {1, 64});
  std::memcpy(in_y.data, table.data<uint8_t>(), table.nbytes());
  const HostTensor positions = HostTensor::zeros(DType::int64, {4});
  expect_rejected([&] { dsv4::apply_rope(x, positions, in_y, false, y); },
                  {"apply_rope: y: expected memory disjoint from cos_sin"}, {&y});
}

// The same rule on the dense ops whose scales or other-branch weights were not covered.
TEST(HostileInputs, Item12_DenseOutputsDisjointFromEveryInput) {
  // linear: an FP8 weight's block scales inside y.
  const HostTensor x = filled(DType::bf16, {2, 128}, 1.0f);
  const HostTensor w = HostTensor::zeros(DType::fp8_e4m3, {128, 128});
  HostTensor y = HostTensor::zeros(DType::fp32, {2, 128});
  const TensorView w_scale_in_y = view_into(y, 0, DType::fp32, {1, 1});
  w_scale_in_y.ptr<float>()[0] = 1.0f;
  expect_rejected([&] { dsv4::linear(x, {}, w, w_scale_in_y, y); },
                  {"linear: y: expected memory disjoint from w_scale"}, {&y});
  // fused_qkv_rms_norm: the kv branch's weight inside the q branch's output.
  const HostTensor q_in = filled(DType::fp32, {2, 64}, 1.0f), kv_in = filled(DType::fp32, {2, 64}, 1.0f);
  const HostTensor wq = filled(DType::fp32, {64}, 1.0f);
  HostTensor q_out = filled(DType::fp32, {2, 64}, 1.0f), kv_out = HostTensor::zeros(DType::fp32, {2, 64});
  const TensorView wkv_in_q_out = view_into(q_out, 0, DType::fp32, {64});
  expect_rejected([&] { dsv4::fused_qkv_rms_norm(q_in, wq, kv_in, wkv_in_q_out, 1e-6f, q_out, kv_out); },
                  {"fused_qkv_rms_norm: q_out: expected memory disjoint from wkv"}, {&q_out, &kv_out});
}

// ---- 15. a config file read is bounded (`dsv4 info --config /dev/zero` read without limit) ---
TEST(HostileInputs, Item15_ConfigReadIsBounded) {
  try {
    dsv4::ModelConfig::from_json_file("/dev/zero");
    ADD_FAILURE() << "expected an error";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find("config '/dev/zero': expected a file of at most 1048576 bytes"),
              std::string::npos)
        << e.what();
  }
  const auto r = dsv4_test::run_cli("info --config /dev/zero", "timeout 60");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("dsv4 info: error: config '/dev/zero'"), std::string::npos) << r.output;
}

}  // namespace
