// The in-process Communicator: ranks are threads of one process sharing host tensors. A sum is
// two barriers: every rank publishes its tensor; each rank adds all of them in rank order into a
// private buffer; once all have read, each writes its buffer back into its own tensor.
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "dsv4/communicator.h"
#include "dsv4/status.h"

namespace dsv4 {

namespace {

constexpr const char* kWhere = "InProcessCommunicator::allreduce_sum";

// What the ranks of one group share.
class InProcessGroup {
 public:
  explicit InProcessGroup(int size) : size_(size), tensors_(static_cast<size_t>(size)) {}
  int size() const { return size_; }
  void publish(int rank, const TensorView& t) {
    std::lock_guard lock(mutex_);
    tensors_[static_cast<size_t>(rank)] = t;
  }
  const TensorView& tensor(int rank) const { return tensors_[static_cast<size_t>(rank)]; }
  // Returns once every rank has arrived (a reusable generation barrier).
  void barrier() {
    std::unique_lock lock(mutex_);
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  const int size_;
  std::vector<TensorView> tensors_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<InProcessGroup> group, int rank)
      : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  Device device() const override { return Device::cpu; }

  void allreduce_sum(const TensorView& t, Stream) override {
    // Checked before the first barrier: a bad tensor on one rank would otherwise leave the others
    // waiting (the caller's mistake is then a hang there, but an error here).
    check_device(kWhere, "t", t, Device::cpu);
    check_dtype(kWhere, "t", t, DType::fp32);
    check_contiguous(kWhere, "t", t);
    group_->publish(rank_, t);
    group_->barrier();
    const int64_t n = t.numel();
    for (int r = 0; r < size(); ++r)
      if (group_->tensor(r).numel() != n)
        fail(kWhere, ": t: expected the same shape on every rank, got ", t.shape_str(), " on rank ",
             rank_, " and ", group_->tensor(r).shape_str(), " on rank ", r);
    sum_.assign(static_cast<size_t>(n), 0.0f);
    for (int r = 0; r < size(); ++r) {
      const float* src = group_->tensor(r).ptr<float>();
      for (int64_t i = 0; i < n; ++i) sum_[static_cast<size_t>(i)] += src[i];
    }
    group_->barrier();  // every rank has read every tensor
    std::memcpy(t.data, sum_.data(), static_cast<size_t>(n) * sizeof(float));
  }

 private:
  std::shared_ptr<InProcessGroup> group_;
  int rank_;
  std::vector<float> sum_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_in_process_group(int size) {
  if (size < 1) fail_expected("make_in_process_group", "size", ">= 1", size);
  auto group = std::make_shared<InProcessGroup>(size);
  std::vector<std::unique_ptr<Communicator>> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(std::make_unique<InProcessCommunicator>(group, r));
  return ranks;
}

}  // namespace dsv4
