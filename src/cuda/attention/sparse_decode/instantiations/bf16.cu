// One layout's instance of the sparse decode kernel (one file per layout: parallel builds).
#include "cuda/attention/sparse_decode/kernel.cuh"

namespace dsv4::cuda::decode {
template void launch_sparse_decode<KvLayout::bf16>(const DecodeParams&, cudaStream_t);
}  // namespace dsv4::cuda::decode
