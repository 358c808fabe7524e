// A build without NCCL (DSV4_NCCL off or NCCL not found): no NCCL group can be made.
#include "dsv4/communicator.h"
#include "dsv4/status.h"

namespace dsv4 {

bool nccl_built() { return false; }

std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<int>&) {
  fail("make_nccl_group: the library was built without NCCL (configure with CUDA and NCCL "
       "found, DSV4_NCCL=AUTO or ON); a CPU layer emulates tensor parallelism with "
       "make_in_process_group");
}

}  // namespace dsv4
