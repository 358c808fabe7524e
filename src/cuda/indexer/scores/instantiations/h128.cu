// Instances of the indexer scores kernel for 65..128 index heads: 1 or 2 tokens per CTA.
#include "cuda/indexer/scores/kernel.cuh"

namespace dsv4::cuda::indexer_scores_detail {
template void launch_scores<128, 128>(const Params&, int, cudaStream_t);
template void launch_scores<256, 128>(const Params&, int, cudaStream_t);
}  // namespace dsv4::cuda::indexer_scores_detail
