#include "cpu/backend.h"

namespace dsv4::cpu {

Device common_device(const char* where, std::initializer_list<NamedView> args) {
  const NamedView* first = nullptr;
  for (const NamedView& a : args) {
    if (!a.view.defined()) continue;
    if (first == nullptr) {
      first = &a;
      continue;
    }
    check_device(where, a.name, a.view, first->view.device);
  }
  return first ? first->view.device : Device::cpu;
}

void throw_cuda_unavailable(const char* where) {
#if defined(DSV4_WITH_CUDA)
  fail(where, ": CUDA backend not implemented");
#else
  fail(where, ": CUDA backend not built (configure with DSV4_CUDA=ON on a machine with nvcc)");
#endif
}

}  // namespace dsv4::cpu
