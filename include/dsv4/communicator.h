// dsv4::Communicator — the one collective tensor parallelism needs (docs/design.md "Tensor
// parallelism"): each rank of a layer split over tp ranks produces a partial y, and the ranks'
// y's are summed in place. Implementations: an in-process group (ranks as threads of one process,
// host tensors: the CPU backend's emulation of tp) and NCCL (CUDA tensors, one GPU per rank),
// which the build includes only when NCCL is found (nccl_built()).
#pragma once

#include <memory>
#include <vector>

#include "dsv4/ops.h"  // Stream
#include "dsv4/tensor.h"

namespace dsv4 {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sums `t` (fp32, contiguous) over the ranks in place: every rank passes a tensor of the same
  // shape, and every rank ends with the same sum. Enqueued on `stream` (CUDA) or done before
  // returning (host tensors). Every rank must call it, in the same order of calls; a rank's call
  // returns (host) once all ranks have called it, so ranks run on different threads.
  virtual void allreduce_sum(const TensorView& t, Stream stream) = 0;
  // Where the tensors it sums live (a layer checks its backend against it when constructed).
  virtual Device device() const = 0;
  // Whether allreduce_sum may be captured into a CUDA graph (NCCL's may; a host sum may not).
  virtual bool graph_capturable() const { return false; }
  // Called by every rank right before it launches a CUDA graph holding a captured allreduce_sum
  // (an allreduce_sum that is not being captured calls it itself); returns once every rank has
  // called it. Why: a collective's kernel waits on its GPU for the other ranks' kernels, and
  // where the ranks are threads of one process, a CUDA call of a rank that has not launched yet
  // may wait for the peer GPUs (allocating or freeing memory mapped into them, NCCL's "one thread
  // per GPU" hazard) — for that kernel, which waits for it. With every rank past its host work
  // before any launches, nothing a rank still does before its launch can wait for a collective
  // kernel. Every rank calls it the same number of times; a no-op where ranks need no such
  // barrier (one rank, host sums, ranks in processes of their own).
  virtual void launch_barrier() {}
};

// A group of `size` in-process ranks (element r is rank r), for host fp32 tensors. Each rank's
// sum adds the ranks' tensors in rank order, so every rank gets the same bits, and the result
// does not depend on thread timing. Throws for size < 1.
std::vector<std::unique_ptr<Communicator>> make_in_process_group(int size);

// Whether the library was built with NCCL (CMake option DSV4_NCCL).
bool nccl_built();
// One NCCL communicator per listed CUDA device (ncclCommInitAll: rank r on devices[r]), for a
// process that drives every rank from its own thread. Each rank's allreduce_sum must be called
// with that rank's device current. Throws dsv4::Error when NCCL is not built, a device is not
// visible, or NCCL fails.
std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<int>& devices);

}  // namespace dsv4
