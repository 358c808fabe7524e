// The host threads of the tensor-parallel ranks one process drives (docs/design.md "Tensor
// parallelism"): rank 0 runs on the caller's thread, ranks 1..n-1 each on a thread of their own
// that lives as long as this object, so a step costs a wake-up, not a thread start. A rank's
// collective (Communicator::allreduce_sum) returns, or is enqueued, only once every rank has
// called it, so the ranks must run at once — which is what run() does. Shared by the CPU
// emulation of tp (ranks summing through an in-process group) and GPU ranks (rank r's thread
// keeps GPU r current, and drives that GPU's NCCL communicator only).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dsv4 {

class RankThreads {
 public:
  // `ranks` >= 1 ranks. `devices`: none (host ranks), or one CUDA device per rank, made current
  // on its thread (rank 0's on the caller's thread for the length of each run()). Throws
  // dsv4::Error naming the argument for ranks < 1 or a device list of another length.
  explicit RankThreads(int ranks, std::vector<int> devices = {});
  ~RankThreads();  // stops and joins the threads (call it between runs, not during one)
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return ranks_; }
  // Rank r's CUDA device, or -1 for host ranks.
  int device(int rank) const { return devices_.empty() ? -1 : devices_[static_cast<size_t>(rank)]; }

  // Calls work(r) for every rank at once and returns when every call has returned; then rethrows
  // the lowest rank's exception, if any. A rank that throws before a collective leaves the others
  // waiting in it, so work must check its inputs (on every rank) before the first collective.
  // One run at a time (one caller thread).
  void run(const std::function<void(int rank)>& work);

 private:
  void worker(int rank);

  int ranks_;
  std::vector<int> devices_;
  std::mutex mutex_;
  std::condition_variable start_, finished_;
  const std::function<void(int)>* work_ = nullptr;  // the current run's
  uint64_t generation_ = 0;                         // runs started
  int pending_ = 0;                                 // ranks 1.. still in the current run
  bool stopping_ = false;
  std::vector<std::exception_ptr> errors_;          // per rank, of the current run
  std::vector<std::thread> threads_;                // ranks 1..
};

}  // namespace dsv4
