// One layout's instances of the sparse decode kernel (one file per layout: parallel builds).
#include "cuda/attention/sparse_decode/kernel.cuh"

namespace dsv4::cuda::decode {
template void launch_sparse_decode<KvLayout::model1_fp8, true>(const DecodeParams&, cudaStream_t);
template void launch_sparse_decode<KvLayout::model1_fp8, false>(const DecodeParams&, cudaStream_t);
}  // namespace dsv4::cuda::decode
