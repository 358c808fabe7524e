// Sparse prefill kernel, d_qk = 576 (one instantiation per file keeps builds parallel).
#if defined(DSV4_HAVE_CUTLASS)
#include "cuda/attention/sparse_prefill/kernel.cuh"

namespace dsv4::cuda::sparse_prefill_detail {
template void launch<576>(const Params& params, Schedule schedule, CUstream_st* stream);
}  // namespace dsv4::cuda::sparse_prefill_detail
#endif
