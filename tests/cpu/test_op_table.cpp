// The backend tables (src/ops/backend.h) and `dsv4 info --ops`: every op of op_table.h has a row
// in the CPU and CUDA tables and in the Triton table except the ops that backend does not
// provide, no row is listed twice, names are unique, dispatch finds the CPU kernels, and the CLI
// prints one matrix line per op with the backends' marks. Each would fail if an op lost a row.
#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <string>

#include "cli_test_support.h"
#include "dsv4/device_tensor.h"
#include "dsv4/status.h"
#include "ops/backend.h"
#include "ops/describe.h"

namespace {

using dsv4::Device;
using dsv4::ops::BackendDecl;
using dsv4::ops::OpId;

const BackendDecl& backend_named(const std::string& name) {
  for (const BackendDecl* b : dsv4::ops::backends())
    if (name == b->name) return *b;
  throw std::runtime_error("no backend " + name);
}

// The ops the Triton package does not register (python/dsv4attn/triton/registry.py), and the
// host utilities the CUDA backend has no kernel for.
const std::set<OpId> kNotInTriton = {OpId::batched_linear, OpId::residual_add_rms_norm,
                                     OpId::synthetic_hidden, OpId::kv_quantize,
                                     OpId::sparse_mla_indexer_quantize,
                                     OpId::sparse_mla_indexer_key_insert};
const std::set<OpId> kNotInCuda = {OpId::kv_quantize, OpId::kv_dequantize};

TEST(OpTable, BackendsAreTheBuildsTableFiles) {
  std::vector<std::string> names;
  for (const BackendDecl* b : dsv4::ops::backends()) names.push_back(b->name);
  EXPECT_EQ(names, (std::vector<std::string>{"cpu", "cuda", "triton"}));
  EXPECT_TRUE(backend_named("cpu").built);
  EXPECT_EQ(backend_named("cuda").built, dsv4::cuda_built());
  EXPECT_FALSE(backend_named("triton").dispatched_from_cpp);
}

TEST(OpTable, EveryOpHasItsRows) {
  std::set<std::string> op_names;
  for (int i = 0; i < dsv4::ops::kNumOps; ++i) {
    const OpId op = static_cast<OpId>(i);
    const std::string name = dsv4::ops::op_name(op);
    EXPECT_NE(name, "?") << "op " << i << " has no name";
    EXPECT_TRUE(op_names.insert(name).second) << name << " named twice";
    EXPECT_NE(dsv4::ops::find_row(backend_named("cpu"), op), nullptr) << name << ": no CPU row";
    EXPECT_EQ(dsv4::ops::find_row(backend_named("cuda"), op) != nullptr, kNotInCuda.count(op) == 0)
        << name << ": CUDA row present/absent unlike the CUDA kernels";
    EXPECT_EQ(dsv4::ops::find_row(backend_named("triton"), op) != nullptr,
              kNotInTriton.count(op) == 0)
        << name << ": Triton row present/absent unlike registry.py";
  }
}

TEST(OpTable, RowsAreUniqueAndKernelsMatchTheBuild) {
  for (const BackendDecl* b : dsv4::ops::backends()) {
    std::set<OpId> seen;
    for (const dsv4::ops::OpRow& r : b->rows) {
      EXPECT_TRUE(seen.insert(r.op).second)
          << b->name << ": two rows for " << dsv4::ops::op_name(r.op);
      EXPECT_NE(*r.features.dtypes, '\0') << b->name << "/" << dsv4::ops::op_name(r.op);
      // A C++-dispatched, built backend has every kernel; the others have none.
      EXPECT_EQ(r.kernel != nullptr, b->dispatched_from_cpp && b->built)
          << b->name << "/" << dsv4::ops::op_name(r.op);
    }
  }
}

TEST(OpTable, DispatchFindsKernelsOrNamesTheMissingBackend) {
  EXPECT_NE(dsv4::ops::kernel("rms_norm", dsv4::ops::kRmsNorm, Device::cpu), nullptr);
  if (dsv4::cuda_built()) {
    EXPECT_NE(dsv4::ops::kernel("rms_norm", dsv4::ops::kRmsNorm, Device::cuda), nullptr);
  } else {
    try {
      dsv4::ops::kernel("rms_norm", dsv4::ops::kRmsNorm, Device::cuda);
      ADD_FAILURE() << "no error without the CUDA backend";
    } catch (const dsv4::Error& e) {
      EXPECT_NE(std::string(e.what()).find("rms_norm: CUDA backend not built"), std::string::npos)
          << e.what();
    }
  }
}

TEST(OpTable, InfoOpsPrintsOneMatrixLinePerOp) {
  const dsv4_test::CliResult r = dsv4_test::run_cli("info --ops");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, dsv4::ops::describe_op_matrix());
  const std::string cuda_mark = dsv4::cuda_built() ? "yes" : "n/b";
  for (int i = 0; i < dsv4::ops::kNumOps; ++i) {
    const OpId op = static_cast<OpId>(i);
    const std::string name = dsv4::ops::op_name(op);
    // "  <op> <cpu> <cuda> <triton>" in the matrix.
    std::istringstream lines(r.output);
    std::string line;
    bool found = false;
    while (std::getline(lines, line)) {
      std::istringstream words(line);
      std::string w, cpu, cuda, triton;
      if (!(words >> w >> cpu >> cuda >> triton) || w != name) continue;
      found = true;
      EXPECT_EQ(cpu, "yes") << line;
      EXPECT_EQ(cuda, kNotInCuda.count(op) ? "-" : cuda_mark) << line;
      EXPECT_EQ(triton, kNotInTriton.count(op) ? "-" : "yes") << line;
    }
    EXPECT_TRUE(found) << name << " has no matrix line in:\n" << r.output;
  }
  for (const char* want : {"backend cpu (CPU)", "backend cuda (CUDA)", "backend triton (Triton)",
                           "DSV4_BACKEND=triton", "graph    capturable"})
    EXPECT_NE(r.output.find(want), std::string::npos) << want << " missing in:\n" << r.output;
}

}  // namespace
