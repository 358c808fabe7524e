// The NCCL Communicator (built when CMake finds NCCL, DSV4_NCCL): one communicator per GPU of
// this process from ncclCommInitAll, each driven by its own host thread; allreduce_sum is
// ncclAllReduce(sum, fp32) in place on the caller's stream, which NCCL allows inside a CUDA graph
// capture. The ranks are threads of one process, so they share a host barrier that every rank
// passes before it launches a collective (Communicator::launch_barrier says why).
#include <cuda_runtime.h>
#include <nccl.h>

#include <barrier>
#include <memory>
#include <string>
#include <utility>

#include "dsv4/communicator.h"
#include "dsv4/status.h"

namespace dsv4 {

namespace {

constexpr const char* kWhere = "NcclCommunicator::allreduce_sum";

void check_nccl(ncclResult_t r, const char* where, const char* call) {
  if (r != ncclSuccess) fail(where, ": ", call, " failed: ", ncclGetErrorString(r));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, std::shared_ptr<std::barrier<>> launch_barrier)
      : comm_(comm), rank_(rank), size_(size), launch_barrier_(std::move(launch_barrier)) {}
  ~NcclCommunicator() override { ncclCommDestroy(comm_); }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cuda; }
  bool graph_capturable() const override { return true; }

  void allreduce_sum(const TensorView& t, Stream stream) override {
    check_device(kWhere, "t", t, Device::cuda);
    check_dtype(kWhere, "t", t, DType::fp32);
    check_contiguous(kWhere, "t", t);
    // Captured, nothing launches now: the graph's launch passes the barrier instead.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    const cudaError_t err = cudaStreamIsCapturing(stream, &capture);
    if (err != cudaSuccess) fail(kWhere, ": cudaStreamIsCapturing(stream): ", cudaGetErrorString(err));
    if (capture == cudaStreamCaptureStatusNone) launch_barrier();
    check_nccl(ncclAllReduce(t.data, t.data, static_cast<size_t>(t.numel()), ncclFloat32, ncclSum,
                             comm_, stream),
               kWhere, "ncclAllReduce");
  }

  void launch_barrier() override {
    if (size_ > 1) launch_barrier_->arrive_and_wait();
  }

 private:
  ncclComm_t comm_;
  int rank_, size_;
  std::shared_ptr<std::barrier<>> launch_barrier_;  // shared by the group's ranks
};

}  // namespace

bool nccl_built() { return true; }

std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<int>& devices) {
  constexpr const char* where = "make_nccl_group";
  if (devices.empty()) fail_expected(where, "devices", "at least one device", "none");
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess) visible = 0;
  for (int d : devices)
    if (d < 0 || d >= visible)
      fail_expected(where, "devices", "visible CUDA devices 0.." + std::to_string(visible - 1), d);
  const int n = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  check_nccl(ncclCommInitAll(comms.data(), n, devices.data()), where, "ncclCommInitAll");
  const auto barrier = std::make_shared<std::barrier<>>(n);
  std::vector<std::unique_ptr<Communicator>> ranks;
  for (int r = 0; r < n; ++r)
    ranks.push_back(std::make_unique<NcclCommunicator>(comms[static_cast<size_t>(r)], r, n, barrier));
  return ranks;
}

}  // namespace dsv4
