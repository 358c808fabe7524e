#include "layer/rank_threads.h"

#include <string>
#include <utility>

#include "dsv4/status.h"
#include "runtime/device_runtime.h"

namespace dsv4 {

namespace {
constexpr const char* kWhere = "RankThreads";
}  // namespace

RankThreads::RankThreads(int ranks, std::vector<int> devices) : ranks_(ranks), devices_(std::move(devices)) {
  if (ranks < 1) fail_expected(kWhere, "ranks", ">= 1", ranks);
  if (!devices_.empty() && static_cast<int>(devices_.size()) != ranks)
    fail_expected(kWhere, "devices", "none or one per rank (" + std::to_string(ranks) + ")", devices_.size());
  errors_.resize(static_cast<size_t>(ranks));
  for (int r = 1; r < ranks; ++r) threads_.emplace_back([this, r] { worker(r); });
}

RankThreads::~RankThreads() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RankThreads::worker(int rank) {
  // A device that cannot be made current fails this rank's every run (reported by run()).
  std::exception_ptr setup_error;
  try {
    if (device(rank) >= 0) rt::set_device(device(rank), kWhere);
  } catch (...) {
    setup_error = std::current_exception();
  }
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* work = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      work = work_;
    }
    std::exception_ptr error = setup_error;
    if (!error) {
      try {
        (*work)(rank);
      } catch (...) {
        error = std::current_exception();
      }
    }
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      errors_[static_cast<size_t>(rank)] = error;
      if (--pending_ == 0) finished_.notify_one();
    }
  }
}

void RankThreads::run(const std::function<void(int rank)>& work) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    work_ = &work;
    errors_.assign(static_cast<size_t>(ranks_), nullptr);
    pending_ = ranks_ - 1;
    ++generation_;
  }
  start_.notify_all();
  try {
    const rt::DeviceGuard on_device(device(0), kWhere);
    work(0);
  } catch (...) {
    errors_[0] = std::current_exception();  // rank 0's slot: no worker writes it
  }
  {
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [&] { return pending_ == 0; });
    work_ = nullptr;
  }
  for (const std::exception_ptr& e : errors_)
    if (e) std::rethrow_exception(e);
}

}  // namespace dsv4
