// NCCL with world size 1 on one GPU (compiled only when the build found NCCL, DSV4_NCCL): the
// communicator's all-reduce is the identity, and a CUDA layer with a one-rank NCCL group gives
// bit-identical outputs to one without, eagerly and through decode CUDA graphs (which capture the
// ncclAllReduce). Groups over several GPUs: test_tensor_parallel_multi_gpu.cpp.
#include <gtest/gtest.h>

#include "dsv4/communicator.h"
#include "dsv4/device_tensor.h"
#include "dsv4/layer.h"
#include "gpu_test_util.h"
#include "layer_test_support.h"
#include "nccl_test_group.h"

namespace {

TEST(TensorParallelNccl, GroupOfOneAllReduceIsTheIdentity) {
  DSV4_SKIP_WITHOUT_GPU();
  ASSERT_TRUE(dsv4::nccl_built());
  auto group = dsv4_test::nccl_group(1);
  ASSERT_EQ(group.size(), 1u);
  EXPECT_EQ(group[0]->rank(), 0);
  EXPECT_EQ(group[0]->size(), 1);
  EXPECT_EQ(group[0]->device(), dsv4::Device::cuda);
  dsv4::HostTensor host(dsv4::DType::fp32, {3, 5});
  for (int i = 0; i < 15; ++i) host.data<float>()[i] = 0.25f * static_cast<float>(i) - 1.0f;
  dsv4::DeviceTensor dev = dsv4::DeviceTensor::from_host(host);
  group[0]->allreduce_sum(dev.view(), nullptr);
  const dsv4::HostTensor back = dev.to_host();
  EXPECT_EQ(0, std::memcmp(back.data<float>(), host.data<float>(), host.nbytes()));
  // A host tensor is refused, naming the argument.
  EXPECT_THROW(group[0]->allreduce_sum(host, nullptr), dsv4::Error);
}

TEST(TensorParallelNccl, LayerWithAOneRankGroupMatchesTheLayerWithout) {
  DSV4_SKIP_WITHOUT_GPU();
  const dsv4::ModelConfig cfg = dsv4::ModelConfig::builtin("tiny");
  const int layer = 1;  // C4A
  const dsv4::AttentionWeights w = dsv4::random_attention_weights(cfg, layer, 4, /*fp8=*/true);
  auto group = dsv4_test::nccl_group(1);
  const auto outputs = [&](dsv4::Communicator* comm) {
    dsv4::AttentionOptions opts;
    opts.backend = dsv4::Backend::cuda;
    opts.caches.swa_blocks = 8;
    opts.tp = {0, 1, comm};
    dsv4::Attention a(cfg, layer, w, opts);
    dsv4_test::LayerOutputs out;
    std::vector<dsv4::BatchPlan> plans{dsv4::BatchPlan::make({{3, 0, 9}})};
    for (int i = 0; i < 4; ++i) plans.push_back(dsv4::BatchPlan::make({{3, 9 + i, 1}}));  // graphs
    for (const dsv4::BatchPlan& plan : plans) {
      dsv4_test::StepIo io = dsv4_test::step_io(plan, cfg.dim, 8, /*bf16_representable=*/true);
      a.forward(plan, io.x, io.y);
      dsv4_test::record_outputs(plan, io.y, cfg.dim, out);
    }
    return out;
  };
  EXPECT_EQ(outputs(group[0].get()), outputs(nullptr));
}

}  // namespace
